//! Starting the service: the writer, health checks, engine scrapes, fleet
//! membership sources, config reloads (file change, SIGHUP), and the gRPC
//! listener (ext_proc, access log, EDS) and admin listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::accesslog::v3::access_log_service_server::AccessLogServiceServer;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::AdminState;
use crate::config::RouterConfig;
use crate::observe::access_log::LogService;
use crate::reload::Reloader;
use crate::shutdown::Phase;
use crate::state::{Shared, Writer};
use crate::stream::Service;

pub struct ServeOptions {
    pub config: PathBuf,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// Bearer token the admin API requires for changes; none = read-only.
    pub admin_token: Option<String>,
    /// Envoy's admin address, to export its access log loss counters.
    pub envoy_admin: Option<SocketAddr>,
    /// This instance's name among several (route tags, the peer link);
    /// none: a random one.
    pub instance_id: Option<String>,
    /// How long a stopping instance keeps serving after it withdrew its
    /// readiness (see `shutdown`).
    pub drain: Duration,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `fleetroute serve`: logs to stderr (`RUST_LOG`, default info) and serves
/// until SIGTERM or Ctrl-C, then stops within the drain and `GRACE`.
pub fn run(opts: ServeOptions) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let served = rt.block_on(serve(opts));
    // Background tasks (probes, scrapes, the peer link) are dropped, and a
    // blocking one (a lookup) is not waited for beyond this.
    rt.shutdown_timeout(Duration::from_secs(1));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetroute: {e}");
            ExitCode::from(1)
        }
    }
}

/// The peer link, when `peers.redis_url` is set: this instance's prefix
/// changes go out, the others' and their forwarded log entries come in.
fn start_peers(
    shared: &Arc<Shared>,
    writer: &mut Writer,
    cfg: &RouterConfig,
    instance: &str,
) -> Result<Option<crate::peers::PeerLink>, Error> {
    if cfg.peers.redis_url.is_none() {
        tracing::info!(instance = %instance, "no peers.redis_url: this instance routes on its own decisions");
        return Ok(None);
    }
    let updates = writer.share_updates();
    let started = crate::peers::start(shared.clone(), &cfg.peers, instance, updates)?;
    tokio::spawn(crate::observe::access_log::receive(
        shared.clone(),
        started.forwarded,
    ));
    tracing::info!(instance = %instance, flush_ms = cfg.peers.flush_ms,
        "sharing prefixes and access log entries with other instances through Redis");
    Ok(Some(started.link))
}

/// The tasks that reach replicas and membership sources.
fn spawn_probes(shared: &Arc<Shared>) {
    use crate::state::probe;
    tokio::spawn(probe::health::run_checks(shared.clone()));
    tokio::spawn(probe::warmup::run_warmups(shared.clone()));
    tokio::spawn(probe::scrape::run_scrapes(shared.clone()));
    tokio::spawn(crate::placement::run(shared.clone()));
    tokio::spawn(probe::sources::run_sources(shared.clone()));
}

pub async fn serve(opts: ServeOptions) -> Result<(), Error> {
    let token = crate::admin::admin_token(opts.admin_token)?;
    let cfg = RouterConfig::load_valid(&opts.config)
        .map_err(|e| format!("{}:\n{e}", opts.config.display()))?;
    let instance = match opts.instance_id {
        Some(id) if crate::peers::valid_instance_id(&id) => id,
        Some(id) => {
            return Err(format!("--instance-id '{id}': must be 1-64 of [A-Za-z0-9._-]").into());
        }
        None => crate::peers::random_instance_id(),
    };
    let (shared, mut writer) = Writer::named(&cfg, instance.clone());
    // Routing calls fail open until the instance is ready (`report_health`).
    shared.deciding.store(false, Ordering::Relaxed);
    let peers = start_peers(&shared, &mut writer, &cfg, &instance)?;
    // The audit file opens now, so a path that cannot be written stops the
    // start with a clear error rather than losing every record.
    shared
        .tenants
        .start_audit(&cfg.audit)
        .map_err(|e| format!("audit.path: {e}"))?;
    shared.tenants.spawn_upkeep();
    tokio::spawn(writer.run());
    spawn_probes(&shared);
    let reloader = Reloader::new(shared.clone(), opts.config.clone())
        .serving_grpc_on(opts.grpc)
        .watching(&cfg);
    tokio::spawn(reload_on_sighup(reloader.clone()));
    tokio::spawn(reload_on_change(reloader.clone()));
    tokio::spawn(crate::observe::log_health::run(shared.clone()));
    if let Some(addr) = opts.envoy_admin {
        tokio::spawn(crate::observe::envoy_stats::run(shared.clone(), addr));
    }

    crate::peer_auth::check_listen(opts.grpc, &cfg.grpc).map_err(|e| format!("--grpc: {e}"))?;
    if !cfg.grpc.authenticated() {
        tracing::warn!(grpc = %opts.grpc, "gRPC calls are not authenticated (no grpc.token_file): \
            any local process may route, report outcomes and list members");
    }
    let grpc = TcpListener::bind(opts.grpc)
        .await
        .map_err(|e| format!("gRPC listener {}: {e}", opts.grpc))?;
    let admin = TcpListener::bind(opts.admin)
        .await
        .map_err(|e| format!("admin listener {}: {e}", opts.admin))?;
    if token.is_none() {
        tracing::info!("no admin token configured: the admin API is read-only");
    }
    tracing::info!(grpc = %grpc.local_addr()?, admin = %admin.local_addr()?, "fleetroute listening");
    let admin_app = crate::admin::router(AdminState::new(shared.clone(), reloader, token));
    let stopping = shared.shutdown.clone();
    tokio::spawn(async move {
        let closed = async move { stopping.reached(Phase::Closing).await };
        if let Err(e) = axum::serve(admin, admin_app)
            .with_graceful_shutdown(closed)
            .await
        {
            tracing::error!("admin listener failed: {e}");
        }
    });
    tokio::spawn(crate::shutdown::on_signals(
        shared.shutdown.clone(),
        opts.drain,
    ));
    // Replies are small and latency-bound: no Nagle delay on the accepted
    // connections (the builder's nodelay only applies to listeners it binds).
    let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
    let discovery = crate::eds::Service::start(shared.clone());
    let log = match peers {
        Some(link) => LogService::with_peers(shared.clone(), link),
        None => LogService::new(shared.clone()),
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(shared.clone(), health));
    tonic::transport::Server::builder()
        // Every call, whatever its service, shows the token first.
        .layer(tonic::service::InterceptorLayer::new(
            crate::peer_auth::PeerAuth::new(shared.clone()),
        ))
        // An Envoy that vanished without closing its connection would keep
        // its EDS stream (and access log streams) open: ping, and drop the
        // connection when pings go unanswered.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(ExternalProcessorServer::new(Service::new(shared.clone())))
        .add_service(AccessLogServiceServer::new(log))
        .add_service(discovery.ads)
        .add_service(discovery.eds)
        .serve_with_incoming_shutdown(incoming, shared.shutdown.reached(Phase::Closing))
        .await
        .map_err(|e| format!("gRPC server: {e}"))?;
    tracing::info!("stopped");
    Ok(())
}

/// gRPC health (`grpc.health.v1`, for Envoy's active health checks of the
/// ext_proc cluster): NOT_SERVING until ready as `/ready` says (every
/// membership source answered or failed past its grace, every replica
/// probed once), then SERVING until it is told to stop. A dead process
/// answers nothing, which is what moves Envoy off it.
async fn report_health(shared: std::sync::Arc<crate::state::Shared>, health: HealthReporter) {
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    while crate::admin::not_ready(&shared, crate::clock::now()).is_some() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shared.deciding.store(true, Ordering::Relaxed);
    health.set_service_status("", ServingStatus::Serving).await;
    shared.shutdown.reached(Phase::Draining).await;
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
}

async fn reload_on_sighup(reloader: Reloader) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        if let Err(e) = reloader.reload("SIGHUP").await {
            tracing::error!("{e}");
        }
    }
}

/// Polls the config file's and its secret files' modification times and
/// sizes: works for editors that replace a file and for mounted config maps
/// and secrets alike.
async fn reload_on_change(reloader: Reloader) {
    let stamp = |paths: &[std::path::PathBuf]| {
        paths
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
            })
            .collect::<Vec<_>>()
    };
    let mut watched = reloader.watched();
    let mut last = stamp(&watched);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = stamp(&watched);
        // The config file must be there; a secret file may be mid-rotation.
        if now.first().is_some_and(Option::is_some) && now != last {
            if let Err(e) = reloader.reload("file changed").await {
                tracing::error!("{e}");
            }
            watched = reloader.watched();
            last = stamp(&watched);
        }
    }
}
