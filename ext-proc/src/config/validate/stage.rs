//! Stages: names and models unique, fleets resolve inside the residency, and
//! each section of a stage in range.

use std::collections::{HashMap, HashSet};

mod adapters;
mod experiment;
mod fallbacks;

use super::{Errors, fleet::bounds};
use crate::config::{
    AlarmsConfig, OutlierConfig, ReplicaChoiceConfig, RouterConfig, RoutingConfig, StageConfig,
    WarmupConfig,
};

/// What the checks of one stage need to know about the rest of the file.
pub(super) struct Scope<'a> {
    /// `stages[i]`
    pub p: String,
    pub stage: &'a StageConfig,
    pub cfg: &'a RouterConfig,
    /// Fleet name -> region, over the whole file.
    pub regions: &'a HashMap<&'a str, &'a str>,
    /// The stage's own fleets.
    pub fleets: HashSet<&'a str>,
    pub residency: Option<Vec<String>>,
}

pub(super) fn stages(cfg: &RouterConfig, regions: &HashMap<&str, &str>, e: &mut Errors) {
    let mut names = HashSet::new();
    let mut models: HashMap<&str, usize> = HashMap::new();
    for (i, s) in cfg.stages.iter().enumerate() {
        let p = format!("stages[{i}]");
        e.name(format!("{p}.name"), &s.name, b"/");
        if !names.insert(s.name.as_str()) {
            e.push(format!("{p}.name"), format!("duplicate stage '{}'", s.name));
        }
        for (j, m) in s.models.iter().enumerate() {
            if let Some(other) = models.insert(m, i) {
                e.push(
                    format!("{p}.models[{j}]"),
                    format!(
                        "model '{m}' already belongs to stage '{}'",
                        cfg.stages[other].name
                    ),
                );
            }
        }
        let scope = Scope {
            p,
            stage: s,
            cfg,
            regions,
            fleets: HashSet::new(),
            residency: s.residency.as_ref().map(|r| r.to_vec()),
        };
        adapters::adapters(&scope, i, &mut models, e);
        stage(scope, e);
    }
    fallbacks::loops(cfg, e);
    if let Some(d) = &cfg.default_stage {
        e.ensure(
            names.contains(d.as_str()),
            "default_stage",
            format!("unknown stage '{d}'"),
        );
    }
}

fn stage(mut sc: Scope<'_>, e: &mut Errors) {
    let (s, p) = (sc.stage, sc.p.clone());
    fleets(&mut sc, e);
    if let Some(b) = s.replicas {
        bounds(b, format!("{p}.replicas"), e);
        // The autoscaling signal keeps every fleet at its minimum: the
        // minimums must fit in the stage's maximum.
        let mins: u32 = s
            .fleet_names()
            .filter_map(|n| sc.cfg.fleets.iter().find(|f| &f.name == n))
            .map(|f| f.hosts.map_or(f.endpoints.len() as u32, |h| h.min))
            .sum();
        e.ensure(
            mins <= b.max,
            format!("{p}.replicas.max"),
            format!(
                "{} is below the {mins} replicas its fleets' minimums (hosts.min, else their endpoints) add up to",
                b.max
            ),
        );
    }
    if s.warm_replicas > 0 {
        // Only placement loads models without a request.
        let placed = s.fleet_names().any(|n| {
            sc.cfg
                .fleets
                .iter()
                .any(|f| &f.name == n && f.packing.as_ref().is_some_and(|k| k.placement.is_some()))
        });
        e.ensure(
            placed,
            format!("{p}.warm_replicas"),
            "needs a fleet of the stage with `packing.placement`, which loads models ahead of requests",
        );
        e.in_range(format!("{p}.warm_replicas"), s.warm_replicas, 0..=1024);
    }
    routing(&sc, e);
    replica_choice(&s.replica_choice, &format!("{p}.replica_choice"), e);
    alarms(&s.alarms, &format!("{p}.alarms"), e);
    outlier(&s.outlier, &format!("{p}.outlier"), e);
    if let Some(w) = &s.warmup {
        warmup(w, &format!("{p}.warmup"), e);
    }
    experiment::experiment(&sc, e);
    fallbacks::fallbacks(&sc, e);
    if let Some(a) = &s.admission {
        super::admission::stage(a, &format!("{p}.admission"), e);
    }
}

/// The stage's fleets exist, appear once and lie inside its residency.
fn fleets(sc: &mut Scope<'_>, e: &mut Errors) {
    let p = &sc.p;
    e.ensure(
        !sc.stage.fleets.is_empty(),
        format!("{p}.fleets"),
        "a stage needs at least one fleet",
    );
    e.ensure(
        sc.residency.as_ref().is_none_or(|r| !r.is_empty()),
        format!("{p}.residency"),
        "must name at least one region",
    );
    for (j, entry) in sc.stage.fleets.iter().enumerate() {
        let (name, fp) = (&entry.name, format!("{p}.fleets[{j}]"));
        if let Some(m) = &entry.model {
            // It travels in a header to the filter, like a client's name.
            e.ensure(
                fleetroute_filter::extract::model::model(m).is_some(),
                format!("{fp}.model"),
                format!("'{m}' must be 1-256 printable ASCII characters without spaces or '|'"),
            );
        }
        if !sc.fleets.insert(name.as_str()) {
            e.push(fp, format!("fleet '{name}' listed twice"));
            continue;
        }
        let packed = sc
            .cfg
            .fleets
            .iter()
            .any(|f| &f.name == name && f.packing.is_some());
        if packed && entry.model.is_some() {
            // The replicas load and name each model by its stage's name.
            e.push(
                format!("{fp}.model"),
                format!("fleet '{name}' packs models: it serves this stage's model as '{}', not under another name", sc.stage.models.first().unwrap_or(&sc.stage.name)),
            );
        }
        match sc.regions.get(name.as_str()) {
            None => e.push(fp, format!("unknown fleet '{name}'")),
            Some(region) => {
                if let Some(r) = &sc.residency {
                    e.ensure(
                        r.iter().any(|x| x == region),
                        fp,
                        format!(
                            "fleet '{name}' is in region '{region}', outside the stage's residency [{}]",
                            r.join(", ")
                        ),
                    );
                }
            }
        }
    }
}

impl Scope<'_> {
    /// A fleet a stage section names must be one of the stage's fleets.
    pub fn own_fleet(&self, path: String, name: &str, e: &mut Errors) {
        e.ensure(
            self.fleets.contains(name),
            path,
            format!("unknown fleet '{name}' (not in {}.fleets)", self.p),
        );
    }
}

fn routing(sc: &Scope<'_>, e: &mut Errors) {
    let rp = format!("{}.routing", sc.p);
    match &sc.stage.routing {
        RoutingConfig::Priority(r) => {
            for (j, name) in r.order.iter().flatten().enumerate() {
                sc.own_fleet(format!("{rp}.order[{j}]"), name, e);
            }
            e.ensure(
                r.resume_below > 0.0 && r.resume_below < 1.0,
                format!("{rp}.resume_below"),
                "must be between 0 and 1 (exclusive)",
            );
        }
        RoutingConfig::Weighted(r) => {
            for (name, w) in &r.weights {
                let path = format!("{rp}.weights.{name}");
                sc.own_fleet(path.clone(), name, e);
                e.ensure(
                    w.is_finite() && *w >= 0.0,
                    path,
                    format!("weight {w} must be finite and >= 0"),
                );
            }
        }
        RoutingConfig::Latency(r) | RoutingConfig::Cost(r) => {
            e.in_range(format!("{rp}.exploration"), r.exploration, 0.0..=0.5);
            e.in_range(format!("{rp}.tolerance"), r.tolerance, 0.0..=1.0);
        }
    }
    if let RoutingConfig::Cost(_) = sc.stage.routing {
        for (j, name) in sc.stage.fleet_names().enumerate() {
            if let Some(f) = sc.cfg.fleets.iter().find(|f| &f.name == name) {
                e.ensure(
                    f.cost.is_some(),
                    format!("{}.fleets[{j}]", sc.p),
                    format!("the cost policy needs a cost for fleet '{name}'"),
                );
            }
        }
    }
}

fn replica_choice(rc: &ReplicaChoiceConfig, p: &str, e: &mut Errors) {
    for (field, v) in [
        ("prefix_weight", rc.prefix_weight),
        ("load_weight", rc.load_weight),
        ("engine_queue_tokens", rc.engine_queue_tokens),
        ("tie_tokens", rc.tie_tokens),
        ("load_slack_tokens", rc.load_slack_tokens),
        ("share_slack", rc.share_slack),
        ("share_wait_tokens", rc.share_wait_tokens),
    ] {
        e.non_negative(format!("{p}.{field}"), v);
    }
    e.ensure(
        rc.load_factor.is_finite() && rc.load_factor >= 1.0,
        format!("{p}.load_factor"),
        "must be a finite number >= 1",
    );
    e.ensure(
        rc.share_factor == 0.0 || (rc.share_factor.is_finite() && rc.share_factor >= 1.0),
        format!("{p}.share_factor"),
        "must be 0 (off) or a finite number >= 1",
    );
    e.in_range(format!("{p}.share_floor"), rc.share_floor, 0.0..=1.0);
}

fn alarms(a: &AlarmsConfig, p: &str, e: &mut Errors) {
    if let Some(v) = a.ttft_p95_ms {
        e.positive(format!("{p}.ttft_p95_ms"), v);
    }
    if let Some(v) = a.error_rate {
        e.in_range(format!("{p}.error_rate"), v, 0.0..=1.0);
    }
    e.at_least(format!("{p}.window_s"), a.window_s, 1);
    e.at_most_a_day(format!("{p}.window_s"), a.window_s);
}

fn outlier(o: &OutlierConfig, p: &str, e: &mut Errors) {
    e.ensure(
        o.factor.is_finite() && o.factor > 1.0,
        format!("{p}.factor"),
        "must be a finite number > 1",
    );
    e.in_range(
        format!("{p}.max_ejected_share"),
        o.max_ejected_share,
        0.0..=1.0,
    );
    e.in_range(
        format!("{p}.min_error_rate_gap"),
        o.min_error_rate_gap,
        0.0..=1.0,
    );
    e.non_negative(format!("{p}.min_latency_gap_ms"), o.min_latency_gap_ms);
    e.share(format!("{p}.max_error_rate"), o.max_error_rate);
    e.at_least(format!("{p}.min_samples"), o.min_samples, 1);
    e.at_least(format!("{p}.window_s"), o.window_s, 1);
    e.at_least(format!("{p}.base_ejection_s"), o.base_ejection_s, 1);
    e.at_least(
        format!("{p}.max_ejection_s"),
        o.max_ejection_s,
        o.base_ejection_s,
    );
    e.at_most_a_day(format!("{p}.window_s"), o.window_s);
    e.at_most_a_day(format!("{p}.max_ejection_s"), o.max_ejection_s);
}

fn warmup(w: &WarmupConfig, p: &str, e: &mut Errors) {
    e.ensure(
        !w.prompts.is_empty(),
        format!("{p}.prompts"),
        "must list at least one prompt",
    );
    e.url_path(format!("{p}.path"), &w.path);
    e.at_least(format!("{p}.timeout_ms"), w.timeout_ms, 1);
    for (j, g) in w.prompts.iter().enumerate() {
        e.ensure(
            g.body.is_object(),
            format!("{p}.prompts[{j}].body"),
            "must be a JSON object (a request body)",
        );
    }
}
