//! A stage's fallbacks: other stages that exist, each once, sharing a
//! region with it, never leading back to it; `context` only with a limit
//! to exceed and a longer one to go to.

use std::collections::{HashMap, HashSet};

use super::super::Errors;
use super::Scope;
use crate::config::{Condition, RouterConfig, StageConfig, blocks_retry};

/// Longest context a stage may declare, tokens.
const MAX_CONTEXT_TOKENS: u32 = 100_000_000;

pub(super) fn fallbacks(sc: &Scope<'_>, e: &mut Errors) {
    let (s, p) = (sc.stage, &sc.p);
    if let Some(c) = s.context_tokens {
        e.in_range(format!("{p}.context_tokens"), c, 1..=MAX_CONTEXT_TOKENS);
    }
    let mut seen = HashSet::new();
    for (j, f) in s.fallbacks.iter().enumerate() {
        let fp = format!("{p}.fallbacks[{j}]");
        let Some(to) = sc.cfg.stages.iter().find(|t| t.name == f.stage) else {
            e.push(
                format!("{fp}.stage"),
                format!("unknown stage '{}'", f.stage),
            );
            continue;
        };
        if to.name == s.name {
            e.push(format!("{fp}.stage"), "a stage cannot fall back to itself");
            continue;
        }
        e.ensure(
            seen.insert(to.name.as_str()),
            format!("{fp}.stage"),
            format!("stage '{}' is listed twice", to.name),
        );
        let mut on = HashSet::new();
        let listed = f.on.as_deref().unwrap_or_default();
        e.ensure(
            f.on.is_none() || !listed.is_empty(),
            format!("{fp}.on"),
            "list at least one condition",
        );
        for c in listed {
            e.ensure(
                on.insert(*c),
                format!("{fp}.on"),
                format!("'{}' is listed twice", c.as_str()),
            );
        }
        let mine = residency(s, sc.regions);
        let theirs = residency(to, sc.regions);
        e.ensure(
            mine.iter().any(|r| theirs.contains(r)),
            format!("{fp}.stage"),
            format!(
                "stage '{}' serves only outside this stage's residency [{}]: it could never be used",
                to.name,
                sorted(&mine)
            ),
        );
        // Listed, a condition must be able to apply; absent, only those that
        // can are in effect (`FallbackConfig::conditions`).
        if listed.contains(&Condition::Context) {
            context(s, to, &fp, e);
        }
        if listed.contains(&Condition::Upstream)
            && let Some((fleet, why)) = blocks_retry(sc.cfg, s, to)
        {
            e.push(
                format!("{fp}.on"),
                format!("'upstream' cannot retry across fleet '{fleet}', which {why}"),
            );
        }
    }
}

/// `context` needs a limit here and a longer one (or none) there.
fn context(s: &StageConfig, to: &StageConfig, fp: &str, e: &mut Errors) {
    let Some(mine) = s.context_tokens else {
        e.push(
            format!("{fp}.on"),
            "'context' needs the stage's context_tokens (the limit a prompt exceeds)",
        );
        return;
    };
    if let Some(theirs) = to.context_tokens {
        e.ensure(
            theirs > mine,
            format!("{fp}.on"),
            format!(
                "'context' goes to stage '{}', whose context_tokens ({theirs}) is not longer than this stage's ({mine})",
                to.name
            ),
        );
    }
}

/// A stage's regions: its residency, else its fleets' regions.
fn residency(s: &StageConfig, regions: &HashMap<&str, &str>) -> HashSet<String> {
    match &s.residency {
        Some(r) => r.to_vec().into_iter().collect(),
        None => s
            .fleet_names()
            .filter_map(|n| regions.get(n.as_str()).map(|r| r.to_string()))
            .collect(),
    }
}

fn sorted(set: &HashSet<String>) -> String {
    let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.join(", ")
}

/// Fallbacks that lead back to where they started: refused, with the loop
/// spelled out once (at its first stage in the file).
pub(super) fn loops(cfg: &RouterConfig, e: &mut Errors) {
    let next = |name: &str| -> Vec<usize> {
        cfg.stages
            .iter()
            .find(|s| s.name == name)
            .map(|s| {
                s.fallbacks
                    .iter()
                    .filter_map(|f| cfg.stages.iter().position(|t| t.name == f.stage))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut reported = HashSet::new();
    for (i, s) in cfg.stages.iter().enumerate() {
        if reported.contains(&i) {
            continue;
        }
        if let Some(path) = cycle_from(i, &|k| next(&cfg.stages[k].name)) {
            reported.extend(path.iter().copied());
            let names: Vec<&str> = path.iter().map(|&k| cfg.stages[k].name.as_str()).collect();
            e.push(
                format!("stages[{i}].fallbacks"),
                format!("fallbacks loop: {} -> {}", names.join(" -> "), s.name),
            );
        }
    }
}

/// A path of stages from `start` that returns to it, if any (depth first;
/// the graph has one node per stage, so it ends).
fn cycle_from(start: usize, next: &dyn Fn(usize) -> Vec<usize>) -> Option<Vec<usize>> {
    let mut stack = vec![(start, vec![start])];
    let mut visited = HashSet::new();
    while let Some((at, path)) = stack.pop() {
        for n in next(at) {
            if n == start {
                return Some(path);
            }
            if visited.insert(n) {
                let mut p = path.clone();
                p.push(n);
                stack.push((n, p));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::config::RouterConfig;

    const FLEETS: &str = r#"
fleets:
  - { name: a-eu, region: eu, endpoints: ["10.0.0.1:1"] }
  - { name: b-eu, region: eu, endpoints: ["10.0.1.1:1"] }
  - { name: c-us, region: us, endpoints: ["10.0.2.1:1"] }
stages:
"#;

    fn errors(stages: &str) -> Vec<String> {
        match RouterConfig::parse(&format!("{FLEETS}{stages}")) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn a_sound_list_is_valid_and_on_defaults_to_every_condition() {
        let text = format!(
            "{FLEETS}{}",
            r#"
  - { name: a, fleets: [a-eu], context_tokens: 8000, fallbacks: [{ stage: b }] }
  - { name: b, fleets: [b-eu] }
"#
        );
        let cfg = RouterConfig::parse(&text).unwrap();
        assert_eq!(cfg.stages[0].fallbacks[0].on, None);
    }

    #[test]
    fn each_mistake_is_named_at_its_path() {
        let cases = [
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: nope, on: [unhealthy] }] }",
                "stages[0].fallbacks[0].stage: unknown stage 'nope'",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: a, on: [unhealthy] }] }",
                "stages[0].fallbacks[0].stage: a stage cannot fall back to itself",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: c, on: [unhealthy] }] }\n  - { name: c, fleets: [c-us] }",
                "stages[0].fallbacks[0].stage: stage 'c' serves only outside this stage's residency [eu]",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: b, on: [context] }] }\n  - { name: b, fleets: [b-eu] }",
                "stages[0].fallbacks[0].on: 'context' needs the stage's context_tokens",
            ),
            (
                "  - { name: a, fleets: [a-eu], context_tokens: 9000, fallbacks: [{ stage: b, on: [context] }] }\n  - { name: b, fleets: [b-eu], context_tokens: 4000 }",
                "whose context_tokens (4000) is not longer than this stage's (9000)",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: b, on: [] }] }\n  - { name: b, fleets: [b-eu] }",
                "stages[0].fallbacks[0].on: list at least one condition",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: b, on: [unhealthy] }, { stage: b, on: [saturated] }] }\n  - { name: b, fleets: [b-eu] }",
                "stages[0].fallbacks[1].stage: stage 'b' is listed twice",
            ),
            (
                "  - { name: a, fleets: [a-eu], fallbacks: [{ stage: b, on: [sometimes] }] }\n  - { name: b, fleets: [b-eu] }",
                "unknown variant `sometimes`",
            ),
        ];
        for (stages, want) in cases {
            let errs = errors(stages);
            assert!(errs.iter().any(|e| e.contains(want)), "{want}\n{errs:?}");
        }
    }

    #[test]
    fn a_loop_is_refused_once_with_its_path() {
        let errs = errors(
            r#"
  - { name: a, fleets: [a-eu], fallbacks: [{ stage: b }] }
  - { name: b, fleets: [b-eu], fallbacks: [{ stage: c }] }
  - { name: c, fleets: [a-eu], fallbacks: [{ stage: a }] }
"#,
        );
        let loops: Vec<&String> = errs.iter().filter(|e| e.contains("loop")).collect();
        assert_eq!(loops.len(), 1, "{errs:?}");
        assert!(
            loops[0].contains("stages[0].fallbacks: fallbacks loop: a -> b -> c -> a"),
            "{errs:?}"
        );
    }
}
