//! Active health: a state machine per replica with hysteresis (the probes
//! that feed it run in `probe::health`).

use crate::config::HealthCheckConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Not probed yet: not routed to.
    Unknown,
    Healthy,
    Unhealthy,
}

/// Flips only after `healthy_threshold` passes or `unhealthy_threshold`
/// failures in a row; the very first probe decides at once.
#[derive(Clone, Copy, Debug)]
pub struct HealthMachine {
    pub state: Health,
    streak: u32,
}

impl Default for HealthMachine {
    fn default() -> Self {
        HealthMachine {
            state: Health::Unknown,
            streak: 0,
        }
    }
}

impl HealthMachine {
    /// Records one probe; returns the new state when it flipped.
    pub fn record(&mut self, ok: bool, cfg: &HealthCheckConfig) -> Option<Health> {
        let (target, threshold) = if ok {
            (Health::Healthy, cfg.healthy_threshold)
        } else {
            (Health::Unhealthy, cfg.unhealthy_threshold)
        };
        if self.state == target {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.state == Health::Unknown || self.streak >= threshold {
            self.state = target;
            self.streak = 0;
            return Some(target);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hysteresis() {
        let cfg = HealthCheckConfig {
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            ..Default::default()
        };
        let mut m = HealthMachine::default();
        assert_eq!(
            m.record(true, &cfg),
            Some(Health::Healthy),
            "first probe decides"
        );
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(
            m.record(true, &cfg),
            None,
            "a pass resets the failure streak"
        );
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), None);
        assert_eq!(m.record(false, &cfg), Some(Health::Unhealthy));
        assert_eq!(m.record(true, &cfg), None);
        assert_eq!(m.record(true, &cfg), Some(Health::Healthy));
    }
}
