//! The tasks that reach out to replicas and membership sources: health
//! probes, golden-prompt warmups, engine metric scrapes, DNS and Kubernetes
//! sources. Each sends what it learns to the writer as events; none holds
//! routing state.

pub mod health;
pub mod scrape;
pub mod sources;
pub mod warmup;

use crate::topology::Fleet;

pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()
        .expect("http client")
}

/// A request of the router's own (probe, golden prompt, scrape) to a fleet
/// with its own key carries that key, as routed requests do.
pub fn with_key(req: reqwest::RequestBuilder, fleet: &Fleet) -> reqwest::RequestBuilder {
    match &fleet.key {
        Some(k) => req.header("authorization", k.authorization()),
        None => req,
    }
}
