//! `admission:` and `stages[].admission:` — priority classes and time to
//! first token objectives under overload. Defaults are in `defaults.rs`,
//! checks in `validate/admission.rs`; the behaviour is `crate::admission`.
//!
//! ```yaml
//! admission:
//!   priority_header: x-priority     # a client may lower its tenant's class
//!   max_wait_ms: 5000               # no request is held longer
//! stages:
//!   - name: chat
//!     admission:
//!       ttft_ms: { critical: 1500, standard: 4000 }   # sheddable: none
//! ```
//!
//! A stage without `admission` is never shed nor held: every request is
//! routed as it comes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Priority;

/// Longest hold a config may ask for: below Envoy's `request_timeout` (60 s
/// by default), which also runs while a request's headers wait on ext_proc.
pub const MAX_WAIT_CAP_MS: u64 = 30_000;
/// Most requests held per class and stage.
pub const MAX_QUEUE: u32 = 4096;

#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// A client header naming the request's class (`critical`, `standard`,
    /// `sheddable`). Never under the internal `x-fleetroute-` prefix (the
    /// filter strips those). Unset: the tenant's class only.
    pub priority_header: Option<String>,
    /// Whether the header may also raise a request above its tenant's class
    /// (only when something trusted writes it, e.g. a gateway from a verified
    /// claim). Default: it may only lower it.
    pub header_may_raise: bool,
    /// The longest any request is held, whatever its objective. The rendered
    /// bootstrap's `max_message_timeout` is this plus a margin.
    pub max_wait_ms: u64,
}

/// One stage's objectives and queues.
#[derive(Clone, Debug, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StageAdmission {
    /// Time to first token objective per class, ms; a class without one is
    /// never held, only admitted or refused.
    pub ttft_ms: ClassObjectives,
    /// Share of the tightest objective above a class that the class may not
    /// fill: a replica takes a lower-class request only while its predicted
    /// time to first token stays within (1 − headroom) × that objective, so
    /// a higher-class request arriving next still meets its own.
    pub headroom: f64,
    /// Requests held at most, per class.
    pub queue: ClassQueues,
    /// `retry-after` of a refusal, seconds (a refusal that knows how long the
    /// queue needs to drain says that instead, when longer).
    pub retry_after_s: u32,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClassObjectives {
    /// Objective of critical requests, ms.
    pub critical: Option<f64>,
    /// Objective of standard requests, ms.
    pub standard: Option<f64>,
    /// Objective of sheddable requests, ms.
    pub sheddable: Option<f64>,
}

#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ClassQueues {
    /// Critical requests held at most.
    pub critical: u32,
    /// Standard requests held at most.
    pub standard: u32,
    /// Sheddable requests held at most (0: refused at once when they cannot be admitted).
    pub sheddable: u32,
}

impl ClassObjectives {
    pub fn get(&self, c: Priority) -> Option<f64> {
        match c {
            Priority::Critical => self.critical,
            Priority::Standard => self.standard,
            Priority::Sheddable => self.sheddable,
        }
    }
}

impl ClassQueues {
    pub fn get(&self, c: Priority) -> u32 {
        match c {
            Priority::Critical => self.critical,
            Priority::Standard => self.standard,
            Priority::Sheddable => self.sheddable,
        }
    }
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// 0 for the highest class.
    pub fn rank(self) -> usize {
        match self {
            Priority::Critical => 0,
            Priority::Standard => 1,
            Priority::Sheddable => 2,
        }
    }

    /// The class a header value names (exact, lowercase words).
    pub fn parse(s: &str) -> Option<Priority> {
        match s {
            "critical" => Some(Priority::Critical),
            "standard" => Some(Priority::Standard),
            "sheddable" => Some(Priority::Sheddable),
            _ => None,
        }
    }
}
