//! Faults a replica can be told to show, set at run time over the control
//! endpoint so a test can break one replica and watch the router react.

use serde::{Deserialize, Serialize};

/// One replica's fault; the default is a healthy replica. Knobs combine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fault {
    /// Completions and `/health` answer this status with an error body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Only `/health` answers this status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_status: Option<u16>,
    /// Prefill and decode take this many times longer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_factor: Option<f64>,
    /// Completions are accepted and not answered while set (then served as
    /// usual); `/health` still answers, so only request timeouts notice.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hang: bool,
    /// Completions break after this many tokens: streams end with an error
    /// instead of `[DONE]`, other requests lose their connection. Requests
    /// shorter than this are answered in full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub die_after_tokens: Option<u64>,
    /// The replica stops listening (connections are refused) and drops its open
    /// connections, as a crashed process would.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refuse: bool,
}

impl Fault {
    /// Parses a fault from JSON; the error says what is wrong, for the 400.
    pub fn parse(json: &[u8]) -> Result<Fault, String> {
        let f: Fault = serde_json::from_slice(json).map_err(|e| format!("fault: {e}"))?;
        for (field, s) in [("status", f.status), ("health_status", f.health_status)] {
            if let Some(s) = s
                && !(400..=599).contains(&s)
            {
                return Err(format!(
                    "fault: {field} must be an HTTP error status (400..=599), not {s}"
                ));
            }
        }
        if let Some(x) = f.slow_factor
            && !(x.is_finite() && x > 0.0)
        {
            return Err(format!(
                "fault: slow_factor must be a positive number, not {x}"
            ));
        }
        Ok(f)
    }

    /// The multiplier for every delay (1 without a slow fault).
    pub fn slow(&self) -> f64 {
        self.slow_factor.unwrap_or(1.0)
    }

    /// The status `/health` answers.
    pub fn health(&self) -> u16 {
        self.status.or(self.health_status).unwrap_or(200)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_combine_and_default_is_healthy() {
        let f = Fault::parse(br#"{"slow_factor": 5.0, "die_after_tokens": 3}"#).unwrap();
        assert_eq!(
            (f.slow(), f.die_after_tokens, f.hang, f.health()),
            (5.0, Some(3), false, 200)
        );
        assert_eq!(Fault::parse(b"{}").unwrap(), Fault::default());
        assert_eq!(
            Fault::parse(br#"{"health_status": 503}"#).unwrap().health(),
            503
        );
        assert_eq!(serde_json::to_string(&Fault::default()).unwrap(), "{}");
    }

    #[test]
    fn bad_faults_are_explained() {
        for (json, says) in [
            (&b"nope"[..], "fault:"),
            (br#"{"status": 200}"#, "status"),
            (br#"{"slow_factor": 0}"#, "slow_factor"),
            (br#"{"hang": "yes"}"#, "boolean"),
            (br#"{"refuse_all": true}"#, "refuse_all"),
        ] {
            let err = Fault::parse(json).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
