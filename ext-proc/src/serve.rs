//! Starting the service: the writer, the health checks, the gRPC and admin
//! listeners, and config reload on SIGHUP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;

use crate::config::RouterConfig;
use crate::state::{Event, Shared, Writer};
use crate::stream::Service;

pub struct ServeOptions {
    pub config: PathBuf,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

pub async fn serve(opts: ServeOptions) -> anyhow_like::Result<()> {
    let cfg =
        RouterConfig::load(&opts.config).map_err(|e| format!("{}:\n{e}", opts.config.display()))?;
    let (shared, writer) = Writer::new(&cfg);
    tokio::spawn(writer.run());
    tokio::spawn(crate::state::health::run_checks(
        shared.clone(),
        shared.events(),
    ));
    tokio::spawn(crate::state::scrape::run_scrapes(shared.clone()));
    tokio::spawn(reload_on_sighup(shared.clone(), opts.config.clone()));

    let grpc = TcpListener::bind(opts.grpc)
        .await
        .map_err(|e| format!("gRPC listener {}: {e}", opts.grpc))?;
    let admin = TcpListener::bind(opts.admin)
        .await
        .map_err(|e| format!("admin listener {}: {e}", opts.admin))?;
    tracing::info!(grpc = %grpc.local_addr()?, admin = %admin.local_addr()?, "fleetroute listening");
    let admin_app = crate::admin::router(shared.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(admin, admin_app).await {
            tracing::error!("admin listener failed: {e}");
        }
    });
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(ExternalProcessorServer::new(Service::new(shared)))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(grpc),
            shutdown(),
        )
        .await
        .map_err(|e| format!("gRPC server: {e}"))?;
    Ok(())
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}

/// Reloads the config file on SIGHUP; an invalid file is refused and the
/// running config stays.
async fn reload_on_sighup(shared: Arc<Shared>, path: PathBuf) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        match RouterConfig::load(&path) {
            Ok(cfg) => shared.emit(Event::Reload(Box::new(cfg))),
            Err(e) => tracing::error!("config reload refused, keeping the running config:\n{e}"),
        }
    }
}

/// A boxed error with a message, for `main`.
pub mod anyhow_like {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}
