//! The Envoy side of `grpc.token_file`: every gRPC service of the rendered
//! bootstrap that calls fleetroute (the routing ext_proc, the access log,
//! the ADS stream) sends the token as initial metadata, and so do the
//! health checks of the fleetroute cluster. The rendered file then holds the
//! token: protect it as the token file itself.

use super::RenderError;
use yaml_serde::{Mapping, Value};

use crate::config::ApiKey;

/// The cluster the bootstrap's gRPC services call.
const CLUSTER: &str = "fleetroute";

fn header(token: &ApiKey) -> Result<Mapping, RenderError> {
    let value = std::str::from_utf8(token.authorization())
        .map_err(|_| "the gRPC token is not text".to_string())?;
    let mut h = Mapping::new();
    h.insert("key".into(), "authorization".into());
    h.insert("value".into(), value.into());
    Ok(h)
}

/// Adds the token to every gRPC service and health check that reaches
/// fleetroute; fails when the template has none to add it to.
pub fn write(doc: &mut Value, token: &ApiKey) -> Result<(), RenderError> {
    let h = header(token)?;
    let services = services(doc, &h);
    if services == 0 {
        return Err("template: no gRPC service calls the fleetroute cluster".into());
    }
    let mut checks = 0;
    let clusters = doc
        .get_mut("static_resources")
        .and_then(|r| r.get_mut("clusters"))
        .and_then(Value::as_sequence_mut)
        .ok_or("template: no clusters")?;
    for c in clusters
        .iter_mut()
        .filter(|c| c.get("name").and_then(Value::as_str) == Some(CLUSTER))
    {
        for hc in c
            .get_mut("health_checks")
            .and_then(Value::as_sequence_mut)
            .into_iter()
            .flatten()
        {
            if let Some(grpc) = hc
                .get_mut("grpc_health_check")
                .and_then(Value::as_mapping_mut)
            {
                let mut option = Mapping::new();
                option.insert("header".into(), Value::Mapping(h.clone()));
                grpc.insert(
                    "initial_metadata".into(),
                    Value::Sequence(vec![Value::Mapping(option)]),
                );
                checks += 1;
            }
        }
    }
    if checks == 0 {
        return Err("template: the fleetroute cluster has no gRPC health check".into());
    }
    Ok(())
}

/// Every mapping with `envoy_grpc.cluster_name: fleetroute` (a
/// `GrpcService`) gets `initial_metadata`; the count of them.
fn services(v: &mut Value, h: &Mapping) -> usize {
    match v {
        Value::Mapping(m) => {
            let calls_us = m
                .get("envoy_grpc")
                .and_then(|g| g.get("cluster_name"))
                .and_then(Value::as_str)
                == Some(CLUSTER);
            let mut n = 0;
            if calls_us {
                m.insert(
                    "initial_metadata".into(),
                    Value::Sequence(vec![Value::Mapping(h.clone())]),
                );
                n += 1;
            }
            n + m.values_mut().map(|c| services(c, h)).sum::<usize>()
        }
        Value::Sequence(s) => s.iter_mut().map(|c| services(c, h)).sum(),
        _ => 0,
    }
}
