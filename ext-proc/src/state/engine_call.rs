//! One control call to a replica's engine (a load, a list of what it
//! holds): the fleet's own key if it has one, a timeout, and no more of the
//! answer read than asked.

use std::time::Duration;

pub struct EngineCall<'a> {
    pub client: &'a reqwest::Client,
    /// `ip:port`.
    pub addr: &'a str,
    pub authorization: Option<&'a [u8]>,
    pub timeout: Duration,
}

impl EngineCall<'_> {
    /// A POST of `body` to `path`: its status and up to `max` bytes of answer.
    pub async fn post(
        &self,
        path: &str,
        body: String,
        max: usize,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), String> {
        let req = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        self.send(req, path, max).await
    }

    /// A GET of `path`: its status and up to `max` bytes of answer.
    pub async fn get(
        &self,
        path: &str,
        max: usize,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), String> {
        self.send(self.client.get(self.url(path)), path, max).await
    }

    /// An engine's refusal, its answer cut short.
    pub fn refused(&self, path: &str, status: reqwest::StatusCode, answer: &[u8]) -> String {
        let text: String = String::from_utf8_lossy(answer).chars().take(200).collect();
        format!("{} answered {status}: {text}", self.url(path))
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(
        &self,
        mut req: reqwest::RequestBuilder,
        path: &str,
        max: usize,
    ) -> Result<(reqwest::StatusCode, Vec<u8>), String> {
        req = req.timeout(self.timeout);
        if let Some(a) = self.authorization {
            req = req.header("authorization", a);
        }
        let mut res = req
            .send()
            .await
            .map_err(|e| format!("{}: {e}", self.url(path)))?;
        let status = res.status();
        let mut body = Vec::new();
        while body.len() < max {
            match res.chunk().await {
                Ok(Some(c)) => body.extend_from_slice(&c[..c.len().min(max - body.len())]),
                _ => break,
            }
        }
        Ok((status, body))
    }
}
