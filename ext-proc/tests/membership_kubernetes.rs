//! Kubernetes membership against an in-test API server: an HTTP server that
//! speaks the EndpointSlice list+watch protocol (resourceVersion, chunked
//! newline-delimited watch events, bookmarks, 410 Gone, dropped watches) with
//! real EndpointSlice JSON, and the real kube client pointed at it.
#![allow(clippy::unwrap_used)] // test code says what it expects

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fleetroute::membership::kubernetes::KubeWatch;
use fleetroute::membership::{self, MemberId, MembershipRx, SourceCounters};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

const DEADLINE: Duration = Duration::from_secs(20);
const NS: &str = "prod";

#[derive(Default)]
struct ApiState {
    /// Slice name -> object, as the store holds it now.
    slices: BTreeMap<String, Value>,
    rv: u64,
    /// Every change with its resourceVersion, for watches that resume.
    history: Vec<(u64, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone (compacted).
    compacted_below: u64,
    /// Query strings of every request, in order.
    requests: Vec<HashMap<String, String>>,
}

#[derive(Clone)]
struct Api {
    state: Arc<Mutex<ApiState>>,
    /// Live watch events; `None` tells every open watch to drop its connection.
    live: broadcast::Sender<Option<String>>,
}

impl Api {
    fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(ApiState::default())),
            live: broadcast::channel(256).0,
        }
    }

    /// Stores `slice` (ADDED or MODIFIED) and tells open watches, unless `silent`
    /// (a change the client can only learn by a re-list).
    fn put(&self, mut slice: Value, silent: bool) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = slice["metadata"]["name"].as_str().unwrap().to_string();
        let kind = if s.slices.insert(name, slice.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if !silent {
            s.history.push((rv, kind, slice.clone()));
            let _ = self.live.send(Some(event(kind, &slice)));
        }
    }

    fn delete(&self, name: &str) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let mut slice = s.slices.remove(name).unwrap();
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.history.push((rv, "DELETED", slice.clone()));
        let _ = self.live.send(Some(event("DELETED", &slice)));
    }

    /// Records a change in history without sending it to open watches, as if
    /// the connection carrying it was lost.
    fn put_unsent(&self, mut slice: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        slice["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = slice["metadata"]["name"].as_str().unwrap().to_string();
        let kind = if s.slices.insert(name, slice.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        s.history.push((rv, kind, slice));
    }

    fn bookmark(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let _ = self.live.send(Some(bookmark(rv)));
        rv
    }

    fn drop_watches(&self) {
        let _ = self.live.send(None);
    }

    /// History is gone: a watch that resumes from before now gets 410.
    fn compact(&self) {
        let mut s = self.state.lock().unwrap();
        s.compacted_below = s.rv + 1;
        s.history.clear();
    }

    fn requests(&self) -> Vec<HashMap<String, String>> {
        self.state.lock().unwrap().requests.clone()
    }
}

fn event(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({ "type": kind, "object": object }))
}

fn bookmark(rv: u64) -> String {
    event(
        "BOOKMARK",
        &json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": { "resourceVersion": rv.to_string() }
        }),
    )
}

fn gone(rv: u64, floor: u64) -> String {
    event(
        "ERROR",
        &json!({
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": format!("too old resource version: {rv} ({floor})"),
            "reason": "Expired",
            "code": 410
        }),
    )
}

fn selected(slice: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let Some((key, value)) = selector.split_once('=') else {
        return false;
    };
    slice["metadata"]["labels"][key].as_str() == Some(value)
}

async fn endpointslices(
    State(api): State<Api>,
    Path(ns): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if ns != NS {
        return (StatusCode::NOT_FOUND, "namespace").into_response();
    }
    api.state.lock().unwrap().requests.push(query.clone());
    let selector = query.get("labelSelector");
    if query.get("watch").map(String::as_str) != Some("true") {
        let s = api.state.lock().unwrap();
        let items: Vec<Value> = s
            .slices
            .values()
            .filter(|v| selected(v, selector))
            .cloned()
            .collect();
        let list = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSliceList",
            "metadata": { "resourceVersion": s.rv.to_string() },
            "items": items
        });
        return (
            StatusCode::OK,
            [("content-type", "application/json")],
            list.to_string(),
        )
            .into_response();
    }

    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    // Subscribe before reading history so no change falls between the two.
    let mut live = api.live.subscribe();
    let (replay, floor) = {
        let s = api.state.lock().unwrap();
        let replay: Vec<String> = s
            .history
            .iter()
            .filter(|(rv, _, v)| *rv > from && selected(v, selector))
            .map(|(_, kind, v)| event(kind, v))
            .collect();
        (replay, s.compacted_below)
    };
    let selector = selector.cloned();
    tokio::spawn(async move {
        if from < floor {
            let _ = tx.send(Ok(Bytes::from(gone(from, floor)))).await;
            return;
        }
        for line in replay {
            if tx.send(Ok(Bytes::from(line))).await.is_err() {
                return;
            }
        }
        while let Ok(Some(line)) = live.recv().await {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["type"] != "BOOKMARK" && !selected(&v["object"], selector.as_ref()) {
                continue;
            }
            if tx.send(Ok(Bytes::from(line))).await.is_err() {
                return;
            }
        }
        // `None` (or a lagged receiver): the connection ends here.
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .unwrap()
}

struct Server {
    api: Api,
    url: String,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_server() -> Server {
    let api = Api::new();
    let app = Router::new()
        .route(
            "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            get(endpointslices),
        )
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        api,
        url: format!("http://{addr}"),
        task,
    }
}

/// An EndpointSlice as the API server returns it.
fn slice(name: &str, service: &str, endpoints: &[(&str, Option<bool>, &str, &str)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready, pod, uid)| {
            let mut conditions = json!({ "serving": true, "terminating": false });
            if let Some(r) = ready {
                conditions["ready"] = json!(r);
            }
            json!({
                "addresses": [ip],
                "conditions": conditions,
                "nodeName": "node-a",
                "targetRef": { "kind": "Pod", "namespace": NS, "name": pod, "uid": uid }
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "generateName": format!("{service}-"),
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"
            },
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Service", "name": service, "uid": "svc-uid", "controller": true, "blockOwnerDeletion": true }]
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            { "name": "metrics", "port": 9090, "protocol": "TCP" },
            { "name": "http", "port": 8000, "protocol": "TCP", "appProtocol": "http" }
        ]
    })
}

fn start_watch(server: &Server) -> (MembershipRx, Arc<SourceCounters>, JoinHandle<()>) {
    let config = kube::Config::new(server.url.parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let (tx, rx) = membership::channel("base");
    let counters = Arc::new(SourceCounters::default());
    let w = KubeWatch {
        namespace: NS.into(),
        service: "vllm".into(),
        port_name: Some("http".into()),
    };
    let task = w.spawn(client, tx, counters.clone());
    (rx, counters, task)
}

/// (address, pod name) pairs.
type Want<'a> = &'a [(&'a str, &'a str)];

fn members_of(rx: &MembershipRx) -> Option<BTreeSet<(SocketAddr, String, String)>> {
    rx.borrow().as_ref().map(|u| {
        u.members
            .iter()
            .map(|m| match &m.identity {
                MemberId::Target { name, uid } => (m.addr, name.to_string(), uid.to_string()),
                MemberId::Addr(a) => (m.addr, a.to_string(), String::new()),
            })
            .collect()
    })
}

async fn wait_members(rx: &mut MembershipRx, want: Want<'_>) {
    let want: BTreeSet<(SocketAddr, String)> = want
        .iter()
        .map(|(ip, pod)| (format!("{ip}:8000").parse().unwrap(), pod.to_string()))
        .collect();
    let got = tokio::time::timeout(
        DEADLINE,
        rx.wait_for(|u| {
            u.as_ref().is_some_and(|u| {
                u.members
                    .iter()
                    .map(|m| match &m.identity {
                        MemberId::Target { name, .. } => (m.addr, name.to_string()),
                        MemberId::Addr(a) => (m.addr, a.to_string()),
                    })
                    .collect::<BTreeSet<_>>()
                    == want
            })
        }),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(
        got,
        "timed out waiting for {want:?}; last: {:?}",
        members_of(rx)
    );
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn watch_requests(api: &Api) -> Vec<HashMap<String, String>> {
    api.requests()
        .into_iter()
        .filter(|q| q.get("watch").map(String::as_str) == Some("true"))
        .collect()
}

#[tokio::test]
async fn kube_lists_ready_endpoints_on_the_named_port_across_slices() {
    let server = start_server().await;
    let api = &server.api;
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[
                ("10.0.0.1", Some(true), "vllm-0", "uid-0"),
                ("10.0.0.2", Some(false), "vllm-1", "uid-1"),
                ("10.0.0.3", None, "vllm-2", "uid-2"),
            ],
        ),
        false,
    );
    api.put(
        slice(
            "vllm-b",
            "vllm",
            &[("10.0.1.1", Some(true), "vllm-3", "uid-3")],
        ),
        false,
    );
    api.put(
        slice(
            "other-a",
            "other",
            &[("10.9.9.9", Some(true), "other-0", "uid-9")],
        ),
        false,
    );

    let (mut rx, counters, task) = start_watch(&server);
    // Not-ready 10.0.0.2 is out, absent `ready` counts as ready, the other Service's slice is not selected.
    wait_members(
        &mut rx,
        &[
            ("10.0.0.1", "vllm-0"),
            ("10.0.0.3", "vllm-2"),
            ("10.0.1.1", "vllm-3"),
        ],
    )
    .await;
    let list = &api.requests()[0];
    assert_eq!(
        list.get("labelSelector").map(String::as_str),
        Some("kubernetes.io/service-name=vllm")
    );
    assert!(
        list.get("watch").is_none(),
        "first request is a list: {list:?}"
    );
    wait_for("a watch request", || !watch_requests(api).is_empty()).await;
    let w = &watch_requests(api)[0];
    assert_eq!(
        w.get("allowWatchBookmarks").map(String::as_str),
        Some("true"),
        "{w:?}"
    );
    assert_eq!(
        w.get("resourceVersion").map(String::as_str),
        Some("3"),
        "{w:?}"
    );

    // The pod becomes ready: it joins.
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[
                ("10.0.0.1", Some(true), "vllm-0", "uid-0"),
                ("10.0.0.2", Some(true), "vllm-1", "uid-1"),
                ("10.0.0.3", None, "vllm-2", "uid-2"),
            ],
        ),
        false,
    );
    wait_members(
        &mut rx,
        &[
            ("10.0.0.1", "vllm-0"),
            ("10.0.0.2", "vllm-1"),
            ("10.0.0.3", "vllm-2"),
            ("10.0.1.1", "vllm-3"),
        ],
    )
    .await;
    assert_eq!(counters.snapshot().relists, 1);
    // Nobody listens any more: the watch stops.
    drop(rx);
    let stopped = tokio::time::timeout(DEADLINE, task).await;
    assert!(stopped.is_ok_and(|r| r.is_ok()), "the watch did not stop");
}

#[tokio::test]
async fn kube_new_pod_on_an_old_ip_is_a_new_member_and_deleted_slices_leave() {
    let server = start_server().await;
    let api = &server.api;
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[("10.0.0.1", Some(true), "vllm-0", "uid-0")],
        ),
        false,
    );
    api.put(
        slice(
            "vllm-b",
            "vllm",
            &[("10.0.1.1", Some(true), "vllm-3", "uid-3")],
        ),
        false,
    );
    let (mut rx, _counters, task) = start_watch(&server);
    wait_members(&mut rx, &[("10.0.0.1", "vllm-0"), ("10.0.1.1", "vllm-3")]).await;
    wait_for("a watch request", || !watch_requests(api).is_empty()).await;

    // vllm-0 is replaced by vllm-7 that got the same IP.
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[("10.0.0.1", Some(true), "vllm-7", "uid-7")],
        ),
        false,
    );
    wait_members(&mut rx, &[("10.0.0.1", "vllm-7"), ("10.0.1.1", "vllm-3")]).await;
    let ids = members_of(&rx).unwrap();
    assert!(
        ids.iter()
            .any(|(_, name, uid)| name == "vllm-7" && uid == "uid-7"),
        "{ids:?}"
    );

    api.delete("vllm-b");
    wait_members(&mut rx, &[("10.0.0.1", "vllm-7")]).await;
    task.abort();
}

#[tokio::test]
async fn kube_resumes_a_dropped_watch_from_the_last_bookmark() {
    let server = start_server().await;
    let api = &server.api;
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[("10.0.0.1", Some(true), "vllm-0", "uid-0")],
        ),
        false,
    );
    let (mut rx, counters, task) = start_watch(&server);
    wait_members(&mut rx, &[("10.0.0.1", "vllm-0")]).await;
    wait_for("a watch request", || !watch_requests(api).is_empty()).await;

    let bookmark_rv = api.bookmark();
    // A change that the dropped connection never carried: only a watch that
    // resumes from the right resourceVersion sees it.
    let before = watch_requests(api).len();
    api.put_unsent(slice(
        "vllm-a",
        "vllm",
        &[
            ("10.0.0.1", Some(true), "vllm-0", "uid-0"),
            ("10.0.0.2", Some(true), "vllm-1", "uid-1"),
        ],
    ));
    api.drop_watches();
    wait_members(&mut rx, &[("10.0.0.1", "vllm-0"), ("10.0.0.2", "vllm-1")]).await;

    let watches = watch_requests(api);
    assert!(watches.len() > before, "no new watch after the drop");
    assert_eq!(
        watches[before].get("resourceVersion").map(String::as_str),
        Some(bookmark_rv.to_string().as_str()),
        "the watch did not resume from the bookmark: {watches:?}"
    );
    assert_eq!(
        counters.snapshot().relists,
        1,
        "a dropped watch must resume, not re-list"
    );
    task.abort();
}

#[tokio::test]
async fn kube_relists_after_410_gone() {
    let server = start_server().await;
    let api = &server.api;
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[("10.0.0.1", Some(true), "vllm-0", "uid-0")],
        ),
        false,
    );
    api.put(
        slice(
            "vllm-b",
            "vllm",
            &[("10.0.1.1", Some(true), "vllm-3", "uid-3")],
        ),
        false,
    );
    let (mut rx, counters, task) = start_watch(&server);
    wait_members(&mut rx, &[("10.0.0.1", "vllm-0"), ("10.0.1.1", "vllm-3")]).await;
    wait_for("a watch request", || !watch_requests(api).is_empty()).await;

    // History is compacted, changes happen that no watch will replay, and the
    // watch drops: resuming gets 410 Gone, only a re-list sees the new state.
    api.compact();
    api.put(
        slice(
            "vllm-a",
            "vllm",
            &[("10.0.0.1", Some(true), "vllm-5", "uid-5")],
        ),
        true,
    );
    {
        let mut s = api.state.lock().unwrap();
        s.rv += 1;
        s.slices.remove("vllm-b");
    }
    api.drop_watches();
    wait_members(&mut rx, &[("10.0.0.1", "vllm-5")]).await;
    let c = counters.snapshot();
    assert!(c.relists >= 2, "{c:?}");
    assert!(c.failures >= 1, "the 410 is counted: {c:?}");
    let lists = api
        .requests()
        .iter()
        .filter(|q| !q.contains_key("watch"))
        .count();
    assert!(lists >= 2, "no second list request");
    task.abort();
}
