//! Who may call the gRPC port. With `grpc.token_file` every call (ext_proc,
//! access log, ADS/EDS, health) must carry `authorization: Bearer <token>`,
//! which Envoy sends as its `GrpcService.initial_metadata`; anything else is
//! refused UNAUTHENTICATED before any service sees it, so a process that is
//! not Envoy cannot route, charge a tenant, eject a replica, read a fleet's
//! key or list the members. The token is the one of the config in effect, so
//! a rotated token file takes effect on reload.

use std::net::SocketAddr;
use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::{Request, Status};

use crate::config::GrpcConfig;
use crate::metrics::Unauthenticated;
use crate::state::Shared;

#[derive(Clone)]
pub struct PeerAuth {
    shared: Arc<Shared>,
}

impl PeerAuth {
    pub fn new(shared: Arc<Shared>) -> Self {
        PeerAuth { shared }
    }
}

impl tonic::service::Interceptor for PeerAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let snapshot = self.shared.snapshot();
        let Some(token) = &snapshot.topo.grpc_token else {
            return Ok(req);
        };
        let given = req.metadata().get("authorization").map(|v| v.as_bytes());
        // Constant time: a guess learns nothing from how long it took.
        match given {
            Some(g) if bool::from(g.ct_eq(token.authorization())) => Ok(req),
            given => {
                let result = if given.is_some() {
                    Unauthenticated::Wrong
                } else {
                    Unauthenticated::Missing
                };
                self.shared.metrics.control.grpc_refused.inc(result);
                Err(Status::unauthenticated(
                    "fleetroute takes gRPC calls only with its token (grpc.token_file)",
                ))
            }
        }
    }
}

/// Whether fleetroute may serve gRPC on `addr` with this config: beyond
/// loopback only when some peer check guards the port.
pub fn check_listen(addr: SocketAddr, grpc: &GrpcConfig) -> Result<(), String> {
    if addr.ip().is_loopback() || grpc.authenticated() {
        return Ok(());
    }
    Err(format!(
        "{addr} is beyond loopback, where every peer must be authenticated: set \
         grpc.token_file (or grpc.token_env) in the router config and give Envoy the token \
         (fleetroute bootstrap writes it), or grpc.trusted_network: true when a mesh or \
         network policy admits only Envoy to this port"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_loopback_a_peer_check_is_required() {
        let open = GrpcConfig::default();
        assert!(check_listen("127.0.0.1:50051".parse().unwrap(), &open).is_ok());
        assert!(check_listen("[::1]:50051".parse().unwrap(), &open).is_ok());
        let e = check_listen("0.0.0.0:50051".parse().unwrap(), &open).unwrap_err();
        assert!(e.contains("grpc.token_file"), "{e}");
        let trusted = GrpcConfig {
            trusted_network: true,
            ..GrpcConfig::default()
        };
        assert!(check_listen("0.0.0.0:50051".parse().unwrap(), &trusted).is_ok());
        let token = GrpcConfig {
            token_env: Some("X".into()),
            ..GrpcConfig::default()
        };
        assert!(check_listen("10.0.0.7:50051".parse().unwrap(), &token).is_ok());
    }
}
