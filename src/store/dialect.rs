//! Where the two engines' SQL differs: numbered placeholders, JSON parameters and columns, and the metadata
//! filter compiler.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::{Any, any::AnyArguments, query::Query};

use super::{Engine, StoreError};

/// `$first, $first+1, ...`: `n` numbered placeholders for an `IN (...)` list.
pub(super) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The image columns that `ImageRow` reads (Postgres keeps metadata as jsonb; the Any driver reads text).
pub(super) fn image_columns(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => "id, external_id, metadata, width, height, bundle_id, created_at",
        Engine::Postgres => {
            "id, external_id, metadata::text AS metadata, width, height, bundle_id, created_at"
        }
    }
}

/// The placeholder for a JSON text parameter stored into a JSON column.
pub(super) fn json_param(engine: Engine, n: usize) -> String {
    match engine {
        Engine::Sqlite => format!("${n}"),
        Engine::Postgres => format!("${n}::jsonb"),
    }
}

/// A value bound to a compiled filter's placeholder.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Bind {
    Text(String),
    Real(f64),
    Int(i64),
}

impl Bind {
    pub(super) fn bind<'q>(
        self,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Query<'q, Any, AnyArguments<'q>> {
        match self {
            Bind::Text(s) => q.bind(s),
            Bind::Real(f) => q.bind(f),
            Bind::Int(i) => q.bind(i),
        }
    }
}

/// A metadata filter compiled to ` AND ...` conditions and their values, numbered from `first`.
#[derive(Debug, Default)]
pub(super) struct FilterSql {
    pub clause: String,
    pub binds: Vec<Bind>,
}

/// Equality on top-level metadata keys: SQLite's json_extract; on Postgres, jsonb containment of
/// `{"key": value}` (which for a scalar is equality, and strict about types: `true` is not `1` there).
pub(super) fn compile_filter(
    engine: Engine,
    filter: &BTreeMap<String, Value>,
    first: usize,
) -> Result<FilterSql, StoreError> {
    let mut out = FilterSql::default();
    for (i, (k, v)) in filter.iter().enumerate() {
        if k.is_empty()
            || k.len() > 64
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(StoreError::Invalid(format!(
                "filter key \"{k}\" is not allowed: use 1-64 letters, digits, '_' or '-'"
            )));
        }
        let scalar_only = || {
            StoreError::Invalid(format!(
                "filter \"{k}\": only strings, numbers and booleans can be matched"
            ))
        };
        let n = first + i;
        match engine {
            Engine::Postgres => {
                if !(v.is_string() || v.is_number() || v.is_boolean()) {
                    return Err(scalar_only());
                }
                let one: serde_json::Map<String, Value> =
                    [(k.clone(), v.clone())].into_iter().collect();
                out.binds.push(Bind::Text(Value::Object(one).to_string()));
                out.clause
                    .push_str(&format!(" AND metadata @> ${n}::jsonb"));
            }
            Engine::Sqlite => {
                out.binds.push(match v {
                    Value::String(s) => Bind::Text(s.clone()),
                    Value::Bool(b) => Bind::Int(i64::from(*b)),
                    Value::Number(n) => match n.as_i64() {
                        Some(i) => Bind::Int(i),
                        None => Bind::Real(n.as_f64().unwrap_or(f64::NAN)),
                    },
                    _ => return Err(scalar_only()),
                });
                out.clause
                    .push_str(&format!(" AND json_extract(metadata, '$.\"{k}\"') = ${n}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn filter(v: Value) -> BTreeMap<String, Value> {
        serde_json::from_value(v).expect("an object")
    }

    #[test]
    fn sqlite_filters_compare_extracted_values_in_key_order() {
        let f = filter(json!({"size": "M", "in_stock": true, "price": 9.5, "count": 3}));
        let sql = compile_filter(Engine::Sqlite, &f, 2).expect("compiles");
        assert_eq!(
            sql.clause,
            " AND json_extract(metadata, '$.\"count\"') = $2 AND json_extract(metadata, '$.\"in_stock\"') = $3 \
             AND json_extract(metadata, '$.\"price\"') = $4 AND json_extract(metadata, '$.\"size\"') = $5"
        );
        // SQLite's JSON booleans extract as integers.
        assert_eq!(
            sql.binds,
            [
                Bind::Int(3),
                Bind::Int(1),
                Bind::Real(9.5),
                Bind::Text("M".into())
            ]
        );
    }

    #[test]
    fn postgres_filters_use_jsonb_containment() {
        let f = filter(json!({"in_stock": true, "size": "M"}));
        let sql = compile_filter(Engine::Postgres, &f, 5).expect("compiles");
        assert_eq!(
            sql.clause,
            " AND metadata @> $5::jsonb AND metadata @> $6::jsonb"
        );
        assert_eq!(
            sql.binds,
            [
                Bind::Text(r#"{"in_stock":true}"#.into()),
                Bind::Text(r#"{"size":"M"}"#.into())
            ]
        );
        assert!(
            compile_filter(Engine::Postgres, &BTreeMap::new(), 2)
                .expect("empty")
                .clause
                .is_empty()
        );
    }

    #[test]
    fn unsafe_keys_and_non_scalar_values_are_refused_on_both_engines() {
        for engine in [Engine::Sqlite, Engine::Postgres] {
            for key in ["", "a'b", "a.b", "x\"", &"k".repeat(65)] {
                let e = compile_filter(engine, &filter(json!({ key: 1 })), 2)
                    .expect_err("a key that could break out of the JSON path");
                assert!(e.to_string().contains("is not allowed"), "{e}");
            }
            for value in [json!(null), json!([1]), json!({"a": 1})] {
                let e = compile_filter(engine, &filter(json!({ "k": value })), 2)
                    .expect_err("not a scalar");
                assert!(e.to_string().contains("only strings, numbers"), "{e}");
            }
        }
    }

    #[test]
    fn placeholders_are_numbered_from_first() {
        assert_eq!(placeholders(2, 3), "$2,$3,$4");
        assert_eq!(placeholders(1, 0), "");
        assert_eq!(json_param(Engine::Postgres, 3), "$3::jsonb");
        assert_eq!(json_param(Engine::Sqlite, 3), "$3");
    }
}
