//! One entry of a stage's `fleets`: a fleet's name, or `{ name, model }` when
//! the fleet serves the stage's model under a name of its own (another
//! provider, another build), e.g.
//! `fleets: [base, { name: burst, model: meta-llama/Llama-3.1-70B-Instruct }]`.

use schemars::JsonSchema;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageFleet {
    pub name: String,
    /// The name this fleet serves the model under; `None`: the client's.
    pub model: Option<String>,
}

impl StageFleet {
    pub fn named(name: &str) -> Self {
        StageFleet {
            name: name.to_string(),
            model: None,
        }
    }
}

/// A name, or the map form.
impl JsonSchema for StageFleet {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StageFleet".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let detailed = generator.subschema_for::<Detailed>();
        schemars::json_schema!({ "anyOf": [{ "type": "string" }, detailed] })
    }
}

/// The map form, with the field checks of every other config section.
#[derive(Deserialize, JsonSchema, Serialize)]
#[serde(deny_unknown_fields)]
struct Detailed {
    /// The fleet.
    name: String,
    /// The name this fleet serves the stage's model under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
}

impl<'de> Deserialize<'de> for StageFleet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StageFleet;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fleet name, or { name, model }")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StageFleet, E> {
                Ok(StageFleet::named(v))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StageFleet, A::Error> {
                let d = Detailed::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(StageFleet {
                    name: d.name,
                    model: d.model,
                })
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for StageFleet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.model {
            None => s.serialize_str(&self.name),
            Some(_) => Detailed {
                name: self.name.clone(),
                model: self.model.clone(),
            }
            .serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_or_a_map() {
        let v: Vec<StageFleet> =
            yaml_serde::from_str("[base, { name: burst, model: meta-llama/X }]").unwrap();
        assert_eq!(v[0], StageFleet::named("base"));
        assert_eq!(v[1].model.as_deref(), Some("meta-llama/X"));
        let back = yaml_serde::to_string(&v).unwrap();
        assert_eq!(yaml_serde::from_str::<Vec<StageFleet>>(&back).unwrap(), v);
        assert!(back.contains("- base"), "a plain name stays plain: {back}");
    }
}
