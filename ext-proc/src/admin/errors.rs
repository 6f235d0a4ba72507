//! Every refusal of the admin API, as one enum with one JSON shape
//! (`api::ErrorBody`) and one status per kind.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};

use super::api::{ErrorBody, ErrorCode, ErrorDetail};
use crate::state::ChangeError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::Invalid(_) => ErrorCode::Invalid,
            ApiError::Unauthorized(_) => ErrorCode::Unauthorized,
            ApiError::Forbidden(_) => ErrorCode::Forbidden,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::MethodNotAllowed(_) => ErrorCode::MethodNotAllowed,
            ApiError::Conflict(_) => ErrorCode::Conflict,
            ApiError::Unavailable(_) => ErrorCode::Unavailable,
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
            },
        }
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> ApiError {
        let message = e.to_string();
        match e {
            ChangeError::Invalid(_) => ApiError::Invalid(message),
            ChangeError::Unknown(_) => ApiError::NotFound(message),
            ChangeError::Conflict(_) => ApiError::Conflict(message),
            ChangeError::Stopped => ApiError::Unavailable(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}
