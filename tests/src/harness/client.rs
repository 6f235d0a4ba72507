//! A plain HTTP client for the scenarios (blocking: each scenario is a
//! straight line of requests and checks; concurrency uses threads).

use std::io::Read;
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::blocking::{Client, Response};

pub fn client() -> &'static Client {
    static C: OnceLock<Client> = OnceLock::new();
    C.get_or_init(|| {
        Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client")
    })
}

pub fn blocking_get(url: &str) -> Option<(u16, String)> {
    let r = client()
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().ok()?))
}

pub fn blocking_send(method: &str, url: &str, body: &str) -> Option<(u16, String)> {
    let m = reqwest::Method::from_bytes(method.as_bytes()).ok()?;
    let r = client()
        .request(m, url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(5))
        .send()
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().ok()?))
}

/// A whole response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The simulated replica that served the request.
    pub fn served_by(&self) -> &str {
        self.header("x-served-by")
            .unwrap_or_else(|| panic!("no x-served-by (status {}): {}", self.status, self.body))
    }
}

fn read(r: Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let mut body = String::new();
    let mut r = r;
    let _ = r.read_to_string(&mut body);
    Reply {
        status,
        headers,
        body,
    }
}

/// POSTs a body (any bytes) with extra headers.
pub fn post(url: &str, body: impl Into<Vec<u8>>, headers: &[(&str, &str)]) -> Reply {
    let mut req = client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.into());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    read(req.send().unwrap_or_else(|e| panic!("POST {url}: {e}")))
}

pub fn chat_body(model: &str, user: Option<&str>, text: &str, stream: bool) -> String {
    chat_body_tokens(model, user, text, stream, 4)
}

/// A chat request asking for `max_tokens` tokens (longer requests hold their
/// replica longer).
pub fn chat_body_tokens(
    model: &str,
    user: Option<&str>,
    text: &str,
    stream: bool,
    max_tokens: u32,
) -> String {
    let mut v = serde_json::json!({
        "model": model,
        "messages": [
            { "role": "system", "content": "You are a terse assistant." },
            { "role": "user", "content": text }
        ],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if stream {
        v["stream_options"] = serde_json::json!({ "include_usage": true });
    }
    if let Some(u) = user {
        v["user"] = serde_json::json!(u);
    }
    v.to_string()
}

/// The sum of a Prometheus text exposition's samples of `metric` whose line
/// contains every one of `labels` (e.g. `arm="control"`).
pub fn metric_sum(exposition: &str, metric: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
