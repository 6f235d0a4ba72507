//! Loading a model on a packed replica through llama.cpp's router API:
//! `POST /models/load {"model"}` starts the load and answers at once, and
//! `GET /models` tells when it is `loaded` (or `failed`). "Already running"
//! (another instance, or an earlier run, loaded it) counts as started.

use std::time::Duration;

use serde::Deserialize;

use super::engine_call::EngineCall;

/// Bytes of an answer to a load that are read.
const MAX_ANSWER: usize = 4096;

/// Bytes of the model list read: each entry is about a kilobyte, and a
/// replica lists a few hundred models at most.
const MAX_LIST: usize = 1 << 20;

/// Between two looks at the model list.
const POLL: Duration = Duration::from_millis(50);

pub(crate) async fn load(call: &EngineCall<'_>, name: &str) -> Result<(), String> {
    let body = serde_json::json!({ "model": name }).to_string();
    let (status, answer) = call.post("/models/load", body, MAX_ANSWER).await?;
    let running = String::from_utf8_lossy(&answer).contains("already running");
    if !status.is_success() && !running {
        return Err(call.refused("/models/load", status, &answer));
    }
    // Bounded by the caller's timeout.
    loop {
        match status_of(call, name).await? {
            Status::Loaded => {
                tracing::info!(model = %name, addr = %call.addr, "model loaded");
                return Ok(());
            }
            Status::Failed(code) => {
                return Err(format!(
                    "{} failed to load model '{name}' (exit code {code})",
                    call.addr
                ));
            }
            Status::Missing => {
                return Err(format!("{} does not list model '{name}'", call.addr));
            }
            Status::Loading => tokio::time::sleep(POLL).await,
        }
    }
}

/// The models a replica has loaded, and those it is loading; `None` when
/// it did not answer with a list (the scrape keeps what it knew).
pub(crate) async fn held(call: &EngineCall<'_>) -> Option<(Vec<String>, Vec<String>)> {
    let (status, body) = call.get("/models", MAX_LIST).await.ok()?;
    if !status.is_success() {
        return None;
    }
    read_list(body).await.ok().map(by_status)
}

fn by_status(list: List) -> (Vec<String>, Vec<String>) {
    let (mut loaded, mut loading) = (Vec::new(), Vec::new());
    for e in list.data {
        match e.status.as_ref().map(|s| s.value.as_str()) {
            None | Some("loaded") => loaded.push(e.id),
            Some("loading") => loading.push(e.id),
            Some(_) => {}
        }
    }
    (loaded, loading)
}

enum Status {
    Loaded,
    Loading,
    Failed(i64),
    Missing,
}

#[derive(Deserialize)]
struct List {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
    #[serde(default)]
    status: Option<EntryStatus>,
}

#[derive(Deserialize)]
struct EntryStatus {
    value: String,
    #[serde(default)]
    failed: bool,
    #[serde(default)]
    exit_code: i64,
}

async fn status_of(call: &EngineCall<'_>, name: &str) -> Result<Status, String> {
    let (status, body) = call.get("/models", MAX_LIST).await?;
    if !status.is_success() {
        return Err(call.refused("/models", status, &body[..body.len().min(MAX_ANSWER)]));
    }
    let list = read_list(body)
        .await
        .map_err(|e| format!("{}/models: not a model list: {e}", call.addr))?;
    Ok(parse(&list, name))
}

/// Parses a model list off the runtime's workers, which also serve the
/// routing calls: a body is up to `MAX_LIST` of whatever the engine sends.
async fn read_list(body: Vec<u8>) -> Result<List, String> {
    tokio::task::spawn_blocking(move || serde_json::from_slice::<List>(&body))
        .await
        .map_err(|_| "the parse panicked".to_string())?
        .map_err(|e| e.to_string())
}

fn parse(list: &List, name: &str) -> Status {
    let Some(e) = list.data.iter().find(|e| e.id == name) else {
        return Status::Missing;
    };
    match e.status.as_ref() {
        // An engine without statuses lists what it serves.
        None => Status::Loaded,
        Some(s) if s.value == "loaded" => Status::Loaded,
        Some(s) if s.failed && s.value != "loading" => Status::Failed(s.exit_code),
        Some(_) => Status::Loading,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(json: &str) -> List {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn reads_llama_cpp_statuses() {
        let l = list(
            r#"{"data":[{"id":"a","status":{"value":"loaded","args":["x"]}},
                {"id":"b","status":{"value":"loading"}},
                {"id":"c","status":{"value":"unloaded","exit_code":1,"failed":true}},
                {"id":"d","status":{"value":"unloaded"}},
                {"id":"e"}]}"#,
        );
        assert!(matches!(parse(&l, "a"), Status::Loaded));
        assert!(matches!(parse(&l, "b"), Status::Loading));
        assert!(matches!(parse(&l, "c"), Status::Failed(1)));
        // Not started yet: the load was asked for, so it is coming.
        assert!(matches!(parse(&l, "d"), Status::Loading));
        assert!(matches!(parse(&l, "e"), Status::Loaded));
        assert!(matches!(parse(&l, "z"), Status::Missing));
        let (loaded, loading) = by_status(l);
        assert_eq!(
            (loaded, loading),
            (vec!["a".to_string(), "e".into()], vec!["b".to_string()])
        );
    }
}
