//! A collection's text field: a dotted metadata path whose words are searched, and how much its sentences count
//! when read by meaning. On the wire (and in the collections table) a field of weight 1 is its bare path,
//! `"name"`; another weight is `{"field": "description", "weight": 0.5}`, so collections made before weights
//! read as they were written.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// The largest weight a field may have: past it one field's sentences would outvote every other's by meaning.
pub const MAX_WEIGHT: f32 = 10.0;

#[derive(Debug, Clone, PartialEq)]
pub struct TextField {
    pub path: String,
    /// The factor on the similarity of the field's sentences in the words-by-meaning channel, 0..=10; 0 reads
    /// the field as keywords only (its sentences are not embedded).
    pub weight: f32,
}

/// The weight if it is one a field may have.
fn in_range(w: f32) -> Option<f32> {
    (0.0..=MAX_WEIGHT).contains(&w).then_some(w)
}

impl TextField {
    pub fn new(path: impl Into<String>) -> TextField {
        TextField {
            path: path.into(),
            weight: 1.0,
        }
    }

    /// The field from its JSON form, or a message saying what a text field must be.
    pub fn from_json(v: &Value) -> Result<TextField, String> {
        const SHAPE: &str =
            r#"a text field is a metadata path ("name") or {"field": "name", "weight": 0.5}"#;
        match v {
            Value::String(s) => Ok(TextField::new(s.as_str())),
            Value::Object(o) => {
                if let Some(k) = o.keys().find(|k| *k != "field" && *k != "weight") {
                    return Err(format!("unknown key `{k}`: {SHAPE}"));
                }
                let path = o
                    .get("field")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("`field` must be a string: {SHAPE}"))?;
                let weight = match o.get("weight") {
                    None => 1.0,
                    Some(w) => w.as_f64().and_then(|w| in_range(w as f32)).ok_or_else(|| {
                        format!("`weight` of `{path}` must be a number from 0 to {MAX_WEIGHT}")
                    })?,
                };
                Ok(TextField {
                    path: path.into(),
                    weight,
                })
            }
            _ => Err(SHAPE.into()),
        }
    }

    /// The field from a command line's `path` or `path^weight` (as in Elasticsearch's `name^2`).
    pub fn parse_arg(s: &str) -> Result<TextField, String> {
        let Some((path, w)) = s.rsplit_once('^') else {
            return Ok(TextField::new(s));
        };
        let weight = w.parse::<f32>().ok().and_then(in_range).ok_or_else(|| {
            format!("`{s}`: the weight after `^` must be a number from 0 to {MAX_WEIGHT}")
        })?;
        Ok(TextField {
            path: path.into(),
            weight,
        })
    }

    pub fn to_json(&self) -> Value {
        if self.weight == 1.0 {
            Value::String(self.path.clone())
        } else {
            serde_json::json!({"field": self.path, "weight": self.weight})
        }
    }

    /// Whether the field's sentences are embedded and searched by meaning.
    pub fn by_meaning(&self) -> bool {
        self.weight > 0.0
    }
}

impl Serialize for TextField {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for TextField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TextField, D::Error> {
        TextField::from_json(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_bare_path_weighs_one_and_is_written_back_bare() {
        let f: TextField = serde_json::from_value(json!("brand.name")).unwrap();
        assert_eq!(f, TextField::new("brand.name"));
        assert_eq!(serde_json::to_value(&f).unwrap(), json!("brand.name"));
    }

    #[test]
    fn a_weighted_field_keeps_its_weight_and_zero_means_keywords_only() {
        let f: TextField =
            serde_json::from_value(json!({"field": "description", "weight": 0.5})).unwrap();
        assert_eq!((f.path.as_str(), f.weight), ("description", 0.5));
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            json!({"field": "description", "weight": 0.5})
        );
        let sku: TextField = serde_json::from_value(json!({"field": "sku", "weight": 0})).unwrap();
        assert!(!sku.by_meaning());
        let plain: TextField = serde_json::from_value(json!({"field": "name"})).unwrap();
        assert_eq!(serde_json::to_value(&plain).unwrap(), json!("name"));
    }

    #[test]
    fn a_command_line_field_takes_its_weight_after_a_caret() {
        assert_eq!(TextField::parse_arg("name"), Ok(TextField::new("name")));
        let d = TextField::parse_arg("description^0.5").unwrap();
        assert_eq!((d.path.as_str(), d.weight), ("description", 0.5));
        assert!(
            TextField::parse_arg("name^lots")
                .unwrap_err()
                .contains("from 0 to 10")
        );
    }

    #[test]
    fn a_bad_field_says_what_a_field_must_be() {
        for (v, says) in [
            (json!({"field": "name", "weight": -1}), "from 0 to 10"),
            (json!({"field": "name", "weight": 11}), "from 0 to 10"),
            (json!({"field": "name", "weight": "high"}), "from 0 to 10"),
            (
                json!({"field": "name", "wieght": 2}),
                "unknown key `wieght`",
            ),
            (json!({"weight": 2}), "`field` must be a string"),
            (json!(3), "a metadata path"),
        ] {
            let e = serde_json::from_value::<TextField>(v.clone()).unwrap_err();
            assert!(e.to_string().contains(says), "{v}: {e}");
        }
    }
}
