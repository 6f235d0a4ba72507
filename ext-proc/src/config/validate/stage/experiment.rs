//! A stage's A/B test and shadow: arms are the stage's fleets, percentages
//! add up, the shadow stays inside the residency.

use std::collections::HashSet;

use super::super::Errors;
use super::Scope;
use crate::config::{AbTest, Shadow};

pub(super) fn experiment(sc: &Scope<'_>, e: &mut Errors) {
    let ex = &sc.stage.experiment;
    if let Some(ab) = &ex.ab {
        ab_test(sc, ab, &format!("{}.experiment.ab", sc.p), e);
    }
    if let Some(sh) = &ex.shadow {
        shadow(sc, sh, &format!("{}.experiment.shadow", sc.p), e);
    }
}

fn ab_test(sc: &Scope<'_>, ab: &AbTest, p: &str, e: &mut Errors) {
    sc.own_fleet(format!("{p}.control"), &ab.control, e);
    e.ensure(
        !ab.variants.is_empty(),
        format!("{p}.variants"),
        "list at least one variant",
    );
    let mut total = 0.0;
    let mut arms = HashSet::from([ab.control.as_str()]);
    for (j, v) in ab.variants.iter().enumerate() {
        let vp = format!("{p}.variants[{j}]");
        sc.own_fleet(format!("{vp}.fleet"), &v.fleet, e);
        e.ensure(
            arms.insert(v.fleet.as_str()),
            format!("{vp}.fleet"),
            format!("'{}' is already an arm of this test", v.fleet),
        );
        if v.percent.is_finite() && v.percent > 0.0 && v.percent <= 100.0 {
            total += v.percent;
        } else {
            e.push(
                format!("{vp}.percent"),
                format!("{} must be in (0, 100]", v.percent),
            );
        }
    }
    e.ensure(
        total <= 100.0,
        format!("{p}.variants"),
        format!("percentages sum to {total}, more than 100"),
    );
}

fn shadow(sc: &Scope<'_>, sh: &Shadow, p: &str, e: &mut Errors) {
    match sc.regions.get(sh.fleet.as_str()) {
        None => e.push(
            format!("{p}.fleet"),
            format!("unknown fleet '{}'", sh.fleet),
        ),
        Some(region) => {
            let allowed = match &sc.residency {
                Some(r) => r.iter().any(|x| x == region),
                // Without a residency the stage's regions are its fleets' regions.
                None => sc
                    .stage
                    .fleet_names()
                    .any(|f| sc.regions.get(f.as_str()) == Some(region)),
            };
            e.ensure(
                allowed,
                format!("{p}.fleet"),
                format!(
                    "fleet '{}' is in region '{region}', outside the stage's residency",
                    sh.fleet
                ),
            );
        }
    }
    // A mirror carries the primary request's headers: the client's key, or
    // the primary fleet's. A fleet with its own key never takes mirrors.
    let credentialed = sc
        .cfg
        .fleets
        .iter()
        .any(|f| f.name == sh.fleet && f.credentials.is_some());
    e.ensure(
        !credentialed,
        format!("{p}.fleet"),
        format!(
            "fleet '{}' has credentials: a mirror would carry another fleet's or the client's Authorization to it",
            sh.fleet
        ),
    );
    e.ensure(
        sh.percent.is_finite() && (0.0..=100.0).contains(&sh.percent),
        format!("{p}.percent"),
        format!("{} must be between 0 and 100", sh.percent),
    );
}
