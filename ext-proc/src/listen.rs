//! Default listen addresses, written once: the clap defaults, the shipped
//! Envoy template and docs/operations/operate.md all use these (tests hold them equal).

/// fleetroute's ext_proc gRPC service.
pub const GRPC: &str = "127.0.0.1:50051";
/// fleetroute's admin API (also where the CLI looks for it).
pub const ADMIN: &str = "127.0.0.1:9190";
/// Envoy's listener for clients.
pub const ENVOY_LISTEN: &str = "127.0.0.1:10000";
/// Envoy's admin listener.
pub const ENVOY_ADMIN: &str = "127.0.0.1:9901";

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = include_str!("../../docs/operations/operate.md");

    #[test]
    fn the_docs_document_these_defaults() {
        let line = format!(
            "ext_proc `{GRPC}`, admin API `{ADMIN}`, Envoy listener `{ENVOY_LISTEN}`, \
             Envoy admin `{ENVOY_ADMIN}`"
        );
        let flat = README.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(&line),
            "docs/operations/operate.md lacks: {line}"
        );
    }

    #[test]
    fn the_defaults_parse() {
        for a in [GRPC, ADMIN, ENVOY_LISTEN, ENVOY_ADMIN] {
            a.parse::<std::net::SocketAddr>().expect(a);
        }
    }
}
