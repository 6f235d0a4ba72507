//! Admission's answers to Envoy: a 429 for a refused request, a 400 for a
//! priority header naming no class, and the timer extension a held request
//! needs (Envoy's ext_proc otherwise gives up on a reply after its
//! `message_timeout`, 200 ms, and with `failure_mode_allow` routes the
//! request past fleetroute).

use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::{
    HeaderMutation, ImmediateResponse, ProcessingResponse, processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;

use super::class::BadPriority;
use super::judge::{Reason, Refusal};
use crate::route::mutation::header;

/// What a held request's hold adds to Envoy's timer: time for the last
/// decision and its reply to travel.
pub const TIMER_MARGIN: Duration = Duration::from_millis(500);

fn immediate(
    status: u16,
    headers: Vec<(&str, String)>,
    body: String,
    details: String,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: Some(HeaderMutation {
                set_headers: headers.into_iter().map(|(k, v)| header(k, v)).collect(),
                remove_headers: Vec::new(),
            }),
            body: body.into_bytes(),
            details,
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn message(stage: &str, r: &Refusal) -> String {
    let class = r.class.as_str();
    match r.reason {
        Reason::Saturated => format!(
            "stage '{stage}' is overloaded: every fleet is saturated and {class} requests are shed"
        ),
        Reason::Reserved => {
            format!("stage '{stage}' is overloaded: its capacity is kept for classes above {class}")
        }
        Reason::QueueFull => {
            format!("stage '{stage}' is overloaded: the queue for {class} requests is full")
        }
        Reason::Objective => format!(
            "stage '{stage}' is overloaded: a {class} request cannot get its first token within its objective, even by waiting"
        ),
        Reason::TimedOut => format!(
            "stage '{stage}' is overloaded: a {class} request waited as long as its objective allows"
        ),
    }
}

/// The 429 of a refusal: `{"error": {"code": "overloaded", "reason", "class", ...}}`
/// with `retry-after`.
pub fn refused(stage: &str, r: &Refusal) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": {
            "message": message(stage, r),
            "type": "overloaded_error",
            "code": "overloaded",
            "reason": r.reason.as_str(),
            "class": r.class.as_str(),
        }
    });
    immediate(
        429,
        vec![
            ("content-type", "application/json".into()),
            ("retry-after", r.retry_after_s.to_string()),
        ],
        body.to_string(),
        format!("fleetroute_overloaded_{}", r.reason.as_str()),
    )
}

/// The 400 of a priority header that names no class.
pub fn bad_priority(b: &BadPriority) -> ProcessingResponse {
    let body = serde_json::json!({
        "error": { "message": b.message(), "type": "invalid_request_error", "code": "invalid_priority" }
    });
    immediate(
        400,
        vec![("content-type", "application/json".into())],
        body.to_string(),
        "fleetroute_invalid_priority".into(),
    )
}

/// The message that extends Envoy's timer for a held request to `hold`
/// plus [`TIMER_MARGIN`]. Envoy takes one per message and caps it at the
/// filter's `max_message_timeout` (the bootstrap sets it).
pub fn extend_timer(hold: Duration) -> ProcessingResponse {
    let t = hold + TIMER_MARGIN;
    ProcessingResponse {
        override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: t.as_secs() as i64,
            nanos: t.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}
