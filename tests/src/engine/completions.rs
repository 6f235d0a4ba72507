//! The completion handlers: queue for a batch slot, then for the prefill lane,
//! look up and fill the prefix cache, sleep for prefill, then decode (all at
//! once, or a chunk per token; a stream's headers go out before all this).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fleetroute_filter::config::BYTES_PER_TOKEN;
use fleetroute_filter::extract::prefix::block_hashes;
use tokio::time::{Instant, sleep_until};

use super::latency::{duration, pause};
use super::openai::{ApiError, Endpoint, Output, Params, Reply, SSE_DONE, Usage};
use super::replica::{Replica, Running};
use super::server::Kill;

pub async fn chat(
    State(rep): State<Arc<Replica>>,
    kill: Option<Extension<Kill>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    complete(rep, Endpoint::Chat, kill.map(|k| k.0), &headers, body).await
}

pub async fn completions(
    State(rep): State<Arc<Replica>>,
    kill: Option<Extension<Kill>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    complete(
        rep,
        Endpoint::Completions,
        kill.map(|k| k.0),
        &headers,
        body,
    )
    .await
}

/// One request, from admission to the last token.
struct Job {
    rep: Arc<Replica>,
    reply: Reply,
    output: Output,
    usage: Usage,
    finish_reason: &'static str,
    /// The token index at which a `die_after_tokens` fault breaks the request.
    die_at: Option<u64>,
    _slot: Running,
    _adapter: Option<super::adapters::InUse>,
}

async fn complete(
    rep: Arc<Replica>,
    endpoint: Endpoint,
    kill: Option<Kill>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if !rep.authorize(authorization.as_deref()) {
        return ApiError::unauthorized().into_response();
    }
    let fault = rep.fault();
    if let Some(status) = fault.status {
        return ApiError::injected(status).into_response();
    }
    if fault.hang {
        rep.unhung().await;
    }
    let params = match Params::parse(endpoint, &body) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // An adapter it knows, by the name in `model`, as vLLM serves them.
    let adapter = rep
        .adapters
        .as_ref()
        .filter(|a| a.knows(&params.model))
        .map(|_| params.model.clone());
    // A packed replica serves a model only while it is loaded.
    if let Some(m) = &rep.packed
        && let Err(r) = m.serve(&params.model)
    {
        return super::models::refusal(r);
    }
    let models = &rep.settings.models;
    if adapter.is_none()
        && rep.packed.is_none()
        && !models.is_empty()
        && !models.contains(&params.model)
    {
        return ApiError::unknown_model(&params.model).into_response();
    }
    let prompt_tokens = params.canonical.len().div_ceil(BYTES_PER_TOKEN) as u64;
    let mut blocks = block_hashes(&params.canonical, rep.settings.block_bytes, usize::MAX);
    if let Some(a) = &adapter {
        // An adapter's KV blocks are its own, as vLLM keys them.
        let salt = xxhash_rust::xxh3::xxh3_64(a.as_bytes());
        for b in &mut blocks {
            *b = xxhash_rust::xxh3::xxh3_64(&(*b ^ salt).to_le_bytes());
        }
    }
    let completion_tokens = params.max_tokens.unwrap_or(rep.settings.default_max_tokens);

    let prep = Prepared {
        rep,
        endpoint,
        params,
        prompt_tokens,
        blocks,
        completion_tokens,
        adapter,
    };
    if prep.params.stream {
        prep.stream()
    } else {
        prep.prefill().await.whole(kill).await
    }
}

/// A parsed request before it holds a batch slot.
struct Prepared {
    rep: Arc<Replica>,
    endpoint: Endpoint,
    params: Params,
    prompt_tokens: u64,
    blocks: Vec<u64>,
    completion_tokens: u64,
    /// The adapter `model` names, when the replica knows it as one.
    adapter: Option<String>,
}

impl Prepared {
    /// Waits for a batch slot and the prefill lane, then prefills.
    async fn prefill(self) -> Job {
        let Prepared {
            rep,
            endpoint,
            params,
            prompt_tokens,
            blocks,
            completion_tokens,
            adapter,
        } = self;
        let slot = rep.admit().await;
        // Then a GPU slot for its adapter (waiting while every one serves
        // other adapters' running requests), loaded if it is not there.
        let (load_ms, in_use) = match (&rep.adapters, &adapter) {
            (Some(ads), Some(name)) => {
                let (ms, guard) = ads.acquire(name).await;
                (ms, Some(guard))
            }
            _ => (0.0, None),
        };
        // The cache is read when this prompt's prefill starts, after the
        // prompts ahead of it in the lane have filled it.
        let lane = rep.prefill_lane().await;
        let cached_tokens = {
            let mut cache = rep.cache();
            let matched = cache.serve(&blocks);
            cache.cached_tokens(matched, prompt_tokens)
        };
        rep.stats.prompt_tokens.fetch_add(prompt_tokens, Relaxed);
        rep.stats.cached_tokens.fetch_add(cached_tokens, Relaxed);
        let prefill = rep.latency().prefill_ms(prompt_tokens - cached_tokens) + load_ms;
        pause(prefill).await;
        drop(lane);

        let created = SystemTime::now().duration_since(UNIX_EPOCH);
        Job {
            reply: Reply {
                endpoint,
                id: rep.next_id(endpoint.id_prefix()),
                created: created.map_or(0, |d| d.as_secs()),
                model: params.model.clone(),
            },
            output: Output::new(&params.model, &params.canonical),
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            },
            // A client-set limit is what ends the output; otherwise it ends by itself.
            finish_reason: params.max_tokens.map_or("stop", |_| "length"),
            die_at: rep
                .fault()
                .die_after_tokens
                .filter(|&n| n < completion_tokens),
            rep,
            _slot: slot,
            _adapter: in_use,
        }
    }

    /// An SSE answer. Its headers go out at once, before the request is
    /// queued or prefilled (as vLLM's and SGLang's servers send them); then
    /// one event per token as it is decoded. Dropping the body (client gone)
    /// leaves the queue or frees the batch slot.
    fn stream(self) -> Response {
        let include_usage = self.params.include_usage;
        let events = async_stream::stream! {
            let job = self.prefill().await;
            let n = job.usage.completion_tokens;
            let mut at = Instant::now();
            for i in 0..n {
                let running = job.rep.stats.running.load(Relaxed);
                at += duration(job.rep.latency().decode_ms_running(1, running));
                sleep_until(at).await;
                if job.die_at == Some(i) {
                    // Let the connection flush what was sent before it breaks.
                    tokio::task::yield_now().await;
                    yield Err(std::io::Error::other("replica died mid-stream (injected fault)"));
                    return;
                }
                job.rep.stats.generation_tokens.fetch_add(1, Relaxed);
                let finish = (i + 1 == n).then_some(job.finish_reason);
                yield Ok(job.reply.chunk(i, &job.output.token(i), finish));
            }
            if include_usage {
                yield Ok(job.reply.usage_chunk(job.usage));
            }
            job.rep.stats.success.fetch_add(1, Relaxed);
            yield Ok(Bytes::from_static(SSE_DONE));
        };
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(events),
        )
            .into_response()
    }
}

impl Job {
    async fn whole(self, kill: Option<Kill>) -> Response {
        let tokens = self.die_at.unwrap_or(self.usage.completion_tokens);
        let running = self.rep.stats.running.load(Relaxed);
        pause(self.rep.latency().decode_ms_running(tokens, running)).await;
        self.rep.stats.generation_tokens.fetch_add(tokens, Relaxed);
        if self.die_at.is_some() {
            if let Some(kill) = kill {
                kill.now();
                // The connection is gone with this future; nothing is sent.
                std::future::pending::<()>().await;
            }
            return ApiError::injected(500).into_response();
        }
        let text = self.output.text(self.usage.completion_tokens);
        self.rep.stats.success.fetch_add(1, Relaxed);
        Json(self.reply.full(&text, self.finish_reason, self.usage)).into_response()
    }
}
