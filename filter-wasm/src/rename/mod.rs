//! The model name per fleet, inside Envoy. When the chosen fleet serves the
//! requested model under another name, ext-proc says so in
//! [`SERVED_MODEL`](crate::contract::SERVED_MODEL); the filter's second root,
//! placed after the ext_proc filter, writes that name into the request body
//! ([`request`]) and the client's name back into the response, JSON or SSE,
//! chunk by chunk ([`response`]). Only the top-level `model` of the request
//! and of each response object is touched; a body that is not what it should
//! be passes untouched.

mod json;
mod output;
pub mod request;
pub mod response;

/// Longest model value either side rewrites; a longer one is left as it is.
pub const MAX_MODEL_VALUE: usize = 1024;

/// A name as a JSON string, quotes included.
pub fn json_string(name: &str) -> Vec<u8> {
    // A &str always serialises.
    serde_json::to_vec(name).unwrap_or_default()
}
