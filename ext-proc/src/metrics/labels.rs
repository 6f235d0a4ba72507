//! Label types: the names from the config (stage, fleet, replica) as strings,
//! every fixed set of values as an enum, so a metric can only be given a value
//! its help text lists, and each is primed at zero.

use std::fmt::Write;
use std::hash::Hash;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// A fixed set of label values.
pub trait Values: Copy + Hash + Eq + std::fmt::Debug + Send + Sync + 'static {
    const ALL: &'static [Self];
    fn as_str(self) -> &'static str;
}

/// Declares an enum of label values with the text each one shows as.
macro_rules! label_values {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl $crate::metrics::labels::Values for $name {
            const ALL: &'static [Self] = &[$($name::$variant),+];
            fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl prometheus_client::encoding::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder,
            ) -> std::fmt::Result {
                $crate::metrics::labels::encode_value(encoder, $crate::metrics::labels::Values::as_str(*self))
            }
        }
    };
}
pub(crate) use label_values;

pub fn encode_value(encoder: &mut LabelValueEncoder, text: &str) -> std::fmt::Result {
    encoder.write_str(text)
}

/// The one label `result` of a family counting what became of something.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ByResult<E>(pub E);

impl<E: Values> EncodeLabelSet for ByResult<E> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        [("result", Text(self.0.as_str()))].encode(encoder)
    }
}

struct Text(&'static str);

impl EncodeLabelValue for Text {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        encode_value(encoder, self.0)
    }
}

/// Counters by result, every result present from the start.
#[derive(Debug, Clone)]
pub struct Results<E: Values>(pub(super) Family<ByResult<E>, Counter>);

impl<E: Values> Default for Results<E> {
    fn default() -> Self {
        let family = Family::default();
        for &e in E::ALL {
            drop(family.get_or_create(&ByResult(e)));
        }
        Results(family)
    }
}

impl<E: Values> Results<E> {
    pub fn inc(&self, result: E) {
        self.add(result, 1);
    }

    pub fn add(&self, result: E, n: u64) {
        self.0.get_or_create(&ByResult(result)).inc_by(n);
    }

    pub fn get(&self, result: E) -> u64 {
        self.0.get_or_create(&ByResult(result)).get()
    }

    /// The counter itself, for a holder that counts without the family.
    pub fn counter(&self, result: E) -> Counter {
        self.0.get_or_create(&ByResult(result)).clone()
    }
}

/// Gauges by result (a value read from elsewhere, such as Envoy's counters).
#[derive(Debug, Clone)]
pub struct ResultGauges<E: Values>(pub(super) Family<ByResult<E>, Gauge>);

impl<E: Values> Default for ResultGauges<E> {
    fn default() -> Self {
        ResultGauges(Family::default())
    }
}

impl<E: Values> ResultGauges<E> {
    pub fn set(&self, result: E, v: i64) {
        self.0.get_or_create(&ByResult(result)).set(v);
    }

    pub fn get(&self, result: E) -> i64 {
        self.0.get_or_create(&ByResult(result)).get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct StageFleet {
    pub stage: String,
    pub fleet: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct FleetLabel {
    pub fleet: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct Replica {
    pub fleet: String,
    pub replica: String,
}
