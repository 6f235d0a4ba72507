//! Several models on one replica, as llama.cpp's server in router mode
//! serves them (`--models-dir`, `--models-max`, `--no-models-autoload`):
//! `GET /models` lists each model with its status (`unloaded`, `loading`,
//! `loaded`), `POST /models/load` starts a load that takes `load_ms` and
//! evicts the least recently used loaded model past `max`, `POST
//! /models/unload` drops one, and a completion for a model that is not
//! loaded is refused ("model is not loaded"). The answers are worded as
//! llama.cpp words them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct ModelSettings {
    /// The models it can load, by name.
    pub models: Vec<String>,
    /// Models loaded at once.
    pub max: usize,
    pub load_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Unloaded,
    Loading,
    Loaded,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Unloaded => "unloaded",
            Status::Loading => "loading",
            Status::Loaded => "loaded",
        }
    }
}

struct State {
    /// Parallel to `settings.models`.
    status: Vec<Status>,
    /// Loaded and loading models, most recently used first.
    lru: Vec<usize>,
    loads: u64,
}

pub struct Models {
    pub settings: ModelSettings,
    state: Mutex<State>,
}

/// A refusal: status and llama.cpp's message.
pub type Refusal = (u16, &'static str);

/// A refusal as llama.cpp answers it.
pub fn refusal((status, message): Refusal) -> axum::response::Response {
    use axum::response::IntoResponse;
    let code =
        axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::BAD_REQUEST);
    let kind = if status == 404 {
        "not_found_error"
    } else {
        "invalid_request_error"
    };
    let body = serde_json::json!({ "error": { "code": status, "message": message, "type": kind } });
    (code, axum::Json(body)).into_response()
}

impl Models {
    pub fn new(settings: ModelSettings) -> Models {
        let n = settings.models.len();
        Models {
            settings,
            state: Mutex::new(State {
                status: vec![Status::Unloaded; n],
                lru: Vec::new(),
                loads: 0,
            }),
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.settings.models.iter().position(|m| m == name)
    }

    /// `GET /models`, as llama.cpp's router lists them.
    pub fn list(&self) -> serde_json::Value {
        let st = self.state.lock().expect("models");
        let data: Vec<serde_json::Value> = self
            .settings
            .models
            .iter()
            .zip(&st.status)
            .map(|(m, s)| {
                serde_json::json!({
                    "id": m, "object": "model", "owned_by": "llamacpp",
                    "status": { "value": s.as_str() }
                })
            })
            .collect();
        serde_json::json!({ "object": "list", "data": data })
    }

    /// `POST /models/load`: starts the load (it ends `load_ms` later).
    pub fn load(self: &Arc<Self>, name: &str) -> Result<(), Refusal> {
        let i = self.index(name).ok_or((404, "File Not Found"))?;
        let mut st = self.state.lock().expect("models");
        if st.status[i] != Status::Unloaded {
            return Err((400, "model is already running"));
        }
        while st.lru.len() >= self.settings.max.max(1) {
            let victim = st.lru.pop().expect("non-empty");
            st.status[victim] = Status::Unloaded;
        }
        st.status[i] = Status::Loading;
        st.lru.insert(0, i);
        st.loads += 1;
        let me = self.clone();
        let ms = self.settings.load_ms;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let mut st = me.state.lock().expect("models");
            if st.status[i] == Status::Loading {
                st.status[i] = Status::Loaded;
            }
        });
        Ok(())
    }

    /// `POST /models/unload`.
    pub fn unload(&self, name: &str) -> Result<(), Refusal> {
        let i = self.index(name).ok_or((404, "File Not Found"))?;
        let mut st = self.state.lock().expect("models");
        st.status[i] = Status::Unloaded;
        st.lru.retain(|&x| x != i);
        Ok(())
    }

    /// A completion for `name`: served only when it is loaded.
    pub fn serve(&self, name: &str) -> Result<(), Refusal> {
        let i = self.index(name).ok_or((400, "model not found"))?;
        let mut st = self.state.lock().expect("models");
        if st.status[i] != Status::Loaded {
            return Err((400, "model is not loaded"));
        }
        st.lru.retain(|&x| x != i);
        st.lru.insert(0, i);
        Ok(())
    }

    /// Loads started so far.
    pub fn loads(&self) -> u64 {
        self.state.lock().expect("models").loads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loads_take_their_time_evict_the_least_recent_and_refuse_as_llama_cpp() {
        let m = Arc::new(Models::new(ModelSettings {
            models: vec!["a".into(), "b".into(), "c".into()],
            max: 2,
            load_ms: 20,
        }));
        assert_eq!(m.serve("a"), Err((400, "model is not loaded")));
        m.load("a").unwrap();
        assert_eq!(m.load("a"), Err((400, "model is already running")));
        assert_eq!(m.serve("a"), Err((400, "model is not loaded")));
        // Loaded once its time has passed: poll, bounded.
        let start = std::time::Instant::now();
        while m.serve("a").is_err() {
            assert!(start.elapsed() < Duration::from_secs(5), "a never loaded");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(15),
            "loaded too soon"
        );
        m.load("b").unwrap();
        m.serve("a").unwrap();
        // a was used after b: c evicts b.
        m.load("c").unwrap();
        let list = m.list().to_string();
        assert!(
            list.contains(
                r#""id":"b","object":"model","owned_by":"llamacpp","status":{"value":"unloaded"}"#
            ),
            "{list}"
        );
        assert_eq!(m.load("zz"), Err((404, "File Not Found")));
        assert_eq!(m.loads(), 3);
    }
}
