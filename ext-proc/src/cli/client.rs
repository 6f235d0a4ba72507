//! The CLI's side of the admin API: typed requests in, typed views or the
//! API's error out.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admin::api::{Applied, Check, ErrorBody, StageView, TenantView, TenantsView};

/// Where the admin API is and how to authorise changes.
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// Why a command failed: refused before sending (a usage error) or by the
/// API, or the API could not be reached.
#[derive(Debug, PartialEq, Eq)]
pub enum CliError {
    Usage(String),
    Api(String),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Api(m) => f.write_str(m),
        }
    }
}

/// The message of a refusal: the API's `error.message`, else the body.
pub fn refusal(status: reqwest::StatusCode, body: &str) -> String {
    match serde_json::from_str::<ErrorBody>(body) {
        Ok(e) => format!("{status}: {}", e.error.message),
        Err(_) => format!("{status}: {}", body.trim()),
    }
}

impl Client {
    pub fn new(admin: &str, token: Option<String>) -> Client {
        let base = if admin.starts_with("http://") || admin.starts_with("https://") {
            admin.trim_end_matches('/').to_string()
        } else {
            format!("http://{admin}")
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("http client");
        Client { base, token, http }
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, CliError> {
        let resp = req.send().await.map_err(|e| {
            CliError::Api(format!(
                "cannot reach the admin API at {} ({e}); set --admin or FLEETROUTE_ADMIN",
                self.base
            ))
        })?;
        let status = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| CliError::Api(format!("{status}: reading the answer: {e}")))?;
        if !status.is_success() {
            return Err(CliError::Api(refusal(status, &body)));
        }
        serde_json::from_str(&body)
            .map_err(|e| CliError::Api(format!("unexpected answer from the admin API: {e}")))
    }

    pub async fn stage(&self, name: &str) -> Result<StageView, CliError> {
        let url = format!("{}{}", self.base, crate::admin::api::STAGE);
        self.send(self.http.get(url).query(&[("name", name)])).await
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantView, CliError> {
        let url = format!("{}{}", self.base, crate::admin::api::TENANT);
        self.send(self.http.get(url).query(&[("name", name)])).await
    }

    pub async fn tenants(&self) -> Result<TenantsView, CliError> {
        let url = format!("{}{}", self.base, crate::admin::api::TENANTS);
        self.send(self.http.get(url)).await
    }

    /// A change: checked here first, so a bad value never leaves the machine.
    pub async fn change<B: Serialize + Check>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<Applied, CliError> {
        body.check().map_err(CliError::Usage)?;
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }

    pub async fn reload(&self) -> Result<Applied, CliError> {
        let path = crate::admin::api::RELOAD;
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        self.send(req).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_shows_the_apis_message_else_the_body() {
        let s = reqwest::StatusCode::CONFLICT;
        let body = r#"{"error":{"code":"conflict","message":"outside the residency"}}"#;
        assert_eq!(refusal(s, body), "409 Conflict: outside the residency");
        let s = reqwest::StatusCode::BAD_GATEWAY;
        assert_eq!(
            refusal(s, "upstream down\n"),
            "502 Bad Gateway: upstream down"
        );
    }
}
