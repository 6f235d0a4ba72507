//! A stage's LoRA adapters: names a client may send, unique over every
//! model and adapter of the file, and every fleet able to hold them.

use std::collections::HashMap;

use super::super::Errors;
use super::Scope;
use crate::config::MAX_ADAPTERS_PER_STAGE;

/// `names`: model and adapter name -> stage index, over the stages seen so far.
pub(super) fn adapters<'a>(
    sc: &Scope<'a>,
    i: usize,
    names: &mut HashMap<&'a str, usize>,
    e: &mut Errors,
) {
    let (s, p) = (sc.stage, &sc.p);
    if s.adapters.is_empty() {
        return;
    }
    e.ensure(
        s.adapters.len() <= MAX_ADAPTERS_PER_STAGE,
        format!("{p}.adapters"),
        format!(
            "{} adapters; a stage lists at most {MAX_ADAPTERS_PER_STAGE}",
            s.adapters.len()
        ),
    );
    for (j, a) in s.adapters.iter().enumerate() {
        let ap = format!("{p}.adapters[{j}]");
        // It arrives as a client's `model`, checked by the filter the same way.
        if fleetroute_filter::extract::model::model(a).is_none() {
            e.push(
                ap,
                format!("'{a}' must be 1-256 printable ASCII characters without spaces or '|'"),
            );
            continue;
        }
        if let Some(other) = names.insert(a, i) {
            let whose = &sc.cfg.stages[other].name;
            e.push(
                ap,
                format!("'{a}' already names a model or adapter of stage '{whose}'"),
            );
        }
    }
    for (j, entry) in s.fleets.iter().enumerate() {
        let fleet = sc.cfg.fleets.iter().find(|f| f.name == entry.name);
        e.ensure(
            fleet.is_none_or(|f| f.lora.is_some()),
            format!("{p}.fleets[{j}]"),
            format!(
                "fleet '{}' has no `lora` section: a stage with adapters needs every fleet to say how its replicas hold them",
                entry.name
            ),
        );
    }
}
