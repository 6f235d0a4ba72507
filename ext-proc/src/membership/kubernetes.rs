//! Kubernetes membership: watch a Service's EndpointSlices and publish the
//! ready endpoints on the named port. kube's watcher does list+watch with
//! bookmarks, re-lists after 410 Gone and re-watches a dropped connection;
//! this module turns its events into the fleet's full member set.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config, ResourceExt};
use tokio::task::JoinHandle;

use super::{MAX_MEMBERS, Member, MemberId, MembershipTx, SourceCounters};
use crate::config::KubernetesSource;

/// At most this many EndpointSlices per Service are held (the API server
/// puts up to 100 endpoints in one slice, so this covers the member bound).
const MAX_SLICES: usize = 256;

/// One Kubernetes-backed fleet, ready to run.
#[derive(Clone, Debug)]
pub struct KubeWatch {
    pub namespace: String,
    pub service: String,
    /// EndpointSlice port name; `None` = the unnamed port.
    pub port_name: Option<String>,
}

/// A client from the in-cluster service account, or `KUBECONFIG` / `~/.kube/config`.
pub async fn client_from_env() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    Client::try_from(config)
}

impl KubeWatch {
    pub fn from_source(src: &KubernetesSource) -> Self {
        Self {
            namespace: src.namespace.clone(),
            service: src.service.clone(),
            port_name: src.port_name.clone(),
        }
    }

    /// Runs the watch as a task until every receiver of `tx` is gone.
    pub fn spawn(
        self,
        client: Client,
        tx: MembershipTx,
        counters: Arc<SourceCounters>,
    ) -> JoinHandle<()> {
        tokio::spawn(self.run(client, tx, counters))
    }

    async fn run(self, client: Client, tx: MembershipTx, counters: Arc<SourceCounters>) {
        let fleet = tx.fleet().to_string();
        let api: Api<EndpointSlice> = Api::namespaced(client, &self.namespace);
        let config = watcher::Config::default()
            .labels(&format!("kubernetes.io/service-name={}", self.service));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        // Slice name -> its ready members; `relisting` collects a fresh list.
        let mut slices: BTreeMap<String, Vec<Member>> = BTreeMap::new();
        let mut relisting: Option<BTreeMap<String, Vec<Member>>> = None;
        let mut listed = false;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = tx.closed() => return,
            };
            let Some(event) = event else { return };
            let changed = match event {
                Ok(Event::Init) => {
                    SourceCounters::bump(&counters.relists);
                    relisting = Some(BTreeMap::new());
                    false
                }
                Ok(Event::InitApply(slice)) => {
                    if let Some(fresh) = relisting.as_mut() {
                        self.insert(fresh, &slice, &fleet);
                    }
                    false
                }
                Ok(Event::InitDone) => {
                    if let Some(fresh) = relisting.take() {
                        slices = fresh;
                    }
                    listed = true;
                    true
                }
                Ok(Event::Apply(slice)) => {
                    self.insert(&mut slices, &slice, &fleet);
                    true
                }
                Ok(Event::Delete(slice)) => slices.remove(&slice.name_any()).is_some(),
                Err(e) => {
                    SourceCounters::bump(&counters.failures);
                    tracing::warn!(
                        fleet,
                        service = self.service,
                        kept = tx.current_len(),
                        error = %e,
                        "endpointslice watch failed; keeping the last set and retrying"
                    );
                    false
                }
            };
            if changed && listed && tx.publish(slices.values().flatten().cloned().collect()) {
                SourceCounters::bump(&counters.updates);
                tracing::info!(
                    fleet,
                    service = self.service,
                    members = tx.current_len(),
                    "kubernetes membership changed"
                );
            }
        }
    }

    fn insert(
        &self,
        slices: &mut BTreeMap<String, Vec<Member>>,
        slice: &EndpointSlice,
        fleet: &str,
    ) {
        let name = slice.name_any();
        if slices.len() >= MAX_SLICES && !slices.contains_key(&name) {
            tracing::warn!(
                fleet,
                service = self.service,
                slice = name,
                "too many endpointslices; ignoring this one"
            );
            return;
        }
        slices.insert(name, slice_members(slice, self.port_name.as_deref()));
    }
}

/// The ready endpoints of one slice on the named port, each identified by its
/// target ref (name + uid) when it has one, else by its address.
pub fn slice_members(slice: &EndpointSlice, port_name: Option<&str>) -> Vec<Member> {
    let wanted = port_name.unwrap_or("");
    let Some(port) = slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref().unwrap_or("") == wanted)
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
    else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for endpoint in &slice.endpoints {
        // The API: a nil `ready` is to be read as ready.
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true);
        if !ready {
            continue;
        }
        let target = endpoint
            .target_ref
            .as_ref()
            .and_then(|r| Some((r.name.as_deref()?, r.uid.as_deref()?)));
        for address in &endpoint.addresses {
            let Ok(ip) = address.parse::<IpAddr>() else {
                continue;
            };
            let addr = SocketAddr::new(ip, port);
            let identity = match target {
                Some((name, uid)) => MemberId::Target {
                    name: name.into(),
                    uid: uid.into(),
                },
                None => MemberId::Addr(addr),
            };
            members.push(Member { addr, identity });
            if members.len() >= MAX_MEMBERS {
                return members;
            }
        }
    }
    members
}
