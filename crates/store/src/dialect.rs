//! Where the two engines' SQL differs: numbered placeholders, JSON parameters and columns, and the metadata
//! filter compiler.

use sqlx::{Any, any::AnyArguments, query::Query};

use super::Engine;
use crate::filter::{Cmp, FieldPath, Filter, Scalar};

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

/// The images' `metadata` column read as text (Postgres keeps jsonb), `table` the query's alias for images
/// ("i." or "").
pub(super) fn metadata_text(engine: Engine, table: &str) -> String {
    match engine {
        Engine::Sqlite => format!("{table}metadata"),
        Engine::Postgres => format!("{table}metadata::text AS metadata"),
    }
}

/// Locks the rows a write transaction reads (SQLite's write transactions hold the whole database already).
pub(super) fn for_update(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => "",
        Engine::Postgres => " FOR UPDATE",
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

/// A metadata filter compiled to ` AND (...)` and its values, numbered from `first`.
#[derive(Debug, Default)]
pub(super) struct FilterSql {
    pub clause: String,
    pub binds: Vec<Bind>,
}

impl FilterSql {
    /// Binds the filter's values to `q`, whose own parameters come before `first`.
    pub(super) fn bind<'q>(
        self,
        q: Query<'q, Any, AnyArguments<'q>>,
    ) -> Query<'q, Any, AnyArguments<'q>> {
        self.binds.into_iter().fold(q, |q, b| match b {
            Bind::Text(s) => q.bind(s),
            Bind::Real(f) => q.bind(f),
            Bind::Int(i) => q.bind(i),
        })
    }
}

/// Compiles a parsed filter. Field paths go into the SQL as literals (their segments are `[A-Za-z0-9_-]`,
/// checked by `FieldPath`); every value is a bound parameter. Each condition is made two-valued (a missing
/// field gives false, never NULL), so that `$not`, `$ne` and `$nin` match images that lack the field.
pub(super) fn compile_filter(engine: Engine, filter: &Filter, first: usize) -> FilterSql {
    if filter.is_all() {
        return FilterSql::default();
    }
    let mut c = Compiler {
        engine,
        next: first,
        binds: vec![],
    };
    let expr = c.expr(filter);
    FilterSql {
        clause: format!(" AND {expr}"),
        binds: c.binds,
    }
}

struct Compiler {
    engine: Engine,
    next: usize,
    binds: Vec<Bind>,
}

impl Compiler {
    fn param(&mut self, b: Bind) -> String {
        let n = self.next;
        self.next += 1;
        self.binds.push(b);
        format!("${n}")
    }

    fn expr(&mut self, f: &Filter) -> String {
        match f {
            Filter::And(parts) | Filter::Or(parts) if parts.is_empty() => "(1 = 1)".into(),
            Filter::And(parts) => self.join(parts, " AND "),
            Filter::Or(parts) => self.join(parts, " OR "),
            Filter::Not(inner) => format!("(NOT {})", self.expr(inner)),
            Filter::Compare(path, Cmp::Ne, v) => {
                format!("(NOT {})", self.compare(path, Cmp::Eq, v))
            }
            Filter::Compare(path, cmp, v) => self.compare(path, *cmp, v),
            Filter::In(path, values, negated) => {
                let any = self.one_of(path, values);
                if *negated {
                    format!("(NOT {any})")
                } else {
                    any
                }
            }
            Filter::Exists(path, exists) => {
                let test = match self.engine {
                    Engine::Sqlite => {
                        format!("json_type(metadata, {}) IS NOT NULL", sqlite_path(path))
                    }
                    Engine::Postgres => format!("{} IS NOT NULL", pg_value(path)),
                };
                if *exists {
                    format!("({test})")
                } else {
                    format!("(NOT ({test}))")
                }
            }
        }
    }

    fn join(&mut self, parts: &[Filter], op: &str) -> String {
        let parts: Vec<String> = parts.iter().map(|p| self.expr(p)).collect();
        format!("({})", parts.join(op))
    }

    /// `(metadata @> '{"a": {"b": v}}')`: the value at the path equals the scalar (for a scalar, jsonb
    /// containment is jsonb equality: strict about types, numeric for numbers, and an array holding the value
    /// does not match). Written as containment so that the GIN index on `metadata` serves it: a selective filter
    /// is counted and scanned from the index instead of from every row. Never NULL (metadata is NOT NULL).
    fn contains(&mut self, path: &FieldPath, v: &Scalar) -> String {
        let doc = path.segments().iter().rev().fold(v.json(), |inner, seg| {
            format!("{{{}:{inner}}}", serde_json::Value::from(seg.as_str()))
        });
        let n = self.param(Bind::Text(doc));
        format!("(metadata @> {n}::jsonb)")
    }

    /// NULL (a missing field) becomes false.
    fn two_valued(&self, cond: String) -> String {
        match self.engine {
            Engine::Sqlite => format!("COALESCE(({cond}), 0)"),
            Engine::Postgres => format!("COALESCE(({cond}), false)"),
        }
    }

    fn compare(&mut self, path: &FieldPath, cmp: Cmp, v: &Scalar) -> String {
        let op = match cmp {
            Cmp::Eq | Cmp::Ne => "=",
            Cmp::Gt => ">",
            Cmp::Gte => ">=",
            Cmp::Lt => "<",
            Cmp::Lte => "<=",
        };
        let cond = match self.engine {
            Engine::Sqlite => {
                let p = sqlite_path(path);
                match v {
                    // JSON booleans are types of their own in json_type; extracted they are 0 and 1.
                    Scalar::Bool(b) => format!("json_type(metadata, {p}) = '{b}'"),
                    Scalar::Str(s) => {
                        let n = self.param(Bind::Text(s.clone()));
                        format!(
                            "json_type(metadata, {p}) = 'text' AND json_extract(metadata, {p}) {op} {n}"
                        )
                    }
                    Scalar::Num(x) => {
                        let n = self.param(number(*x));
                        format!(
                            "json_type(metadata, {p}) IN ('integer', 'real') AND json_extract(metadata, {p}) {op} {n}"
                        )
                    }
                }
            }
            Engine::Postgres => {
                let p = pg_value(path);
                match (cmp, v) {
                    // Never NULL, so not wrapped in two_valued (which would hide it from the GIN index).
                    (Cmp::Eq | Cmp::Ne, _) => return self.contains(path, v),
                    // Strings in byte order, as on SQLite, whatever the database's collation.
                    (_, Scalar::Str(s)) => {
                        let n = self.param(Bind::Text(s.clone()));
                        let t = pg_text(path);
                        format!("jsonb_typeof{p} = 'string' AND {t} COLLATE \"C\" {op} {n}")
                    }
                    (_, v) => {
                        let n = self.param(Bind::Text(v.json()));
                        format!("jsonb_typeof{p} = 'number' AND {p} {op} {n}::jsonb")
                    }
                }
            }
        };
        self.two_valued(cond)
    }

    fn one_of(&mut self, path: &FieldPath, values: &[Scalar]) -> String {
        let cond = match self.engine {
            Engine::Postgres => {
                let any: Vec<String> = values.iter().map(|v| self.contains(path, v)).collect();
                return format!("({})", any.join(" OR "));
            }
            Engine::Sqlite => {
                // One IN list per JSON type, each behind its type check.
                let p = sqlite_path(path);
                let mut any = vec![];
                let strs: Vec<String> = values
                    .iter()
                    .filter_map(|v| match v {
                        Scalar::Str(s) => Some(self.param(Bind::Text(s.clone()))),
                        _ => None,
                    })
                    .collect();
                if !strs.is_empty() {
                    any.push(format!(
                        "(json_type(metadata, {p}) = 'text' AND json_extract(metadata, {p}) IN ({}))",
                        strs.join(", ")
                    ));
                }
                let nums: Vec<String> = values
                    .iter()
                    .filter_map(|v| match v {
                        Scalar::Num(x) => Some(self.param(number(*x))),
                        _ => None,
                    })
                    .collect();
                if !nums.is_empty() {
                    any.push(format!(
                        "(json_type(metadata, {p}) IN ('integer', 'real') AND json_extract(metadata, {p}) IN ({}))",
                        nums.join(", ")
                    ));
                }
                for b in [true, false] {
                    if values.contains(&Scalar::Bool(b)) {
                        any.push(format!("json_type(metadata, {p}) = '{b}'"));
                    }
                }
                any.join(" OR ")
            }
        };
        self.two_valued(cond)
    }
}

/// A text naming an image's product: its `group_by` value with its JSON type (`"5"` is not `5`, and `5` is
/// `5.0`, as `filter::GroupKey` compares them), or the image's own id where the value is not a string, number or
/// boolean.
pub(super) fn product_key(engine: Engine, path: &FieldPath) -> String {
    match engine {
        Engine::Sqlite => {
            let p = sqlite_path(path);
            format!(
                "CASE json_type(metadata, {p}) \
                 WHEN 'text' THEN 'str:' || json_extract(metadata, {p}) \
                 WHEN 'integer' THEN 'num:' || (json_extract(metadata, {p}) + 0.0) \
                 WHEN 'real' THEN 'num:' || (json_extract(metadata, {p}) + 0.0) \
                 WHEN 'true' THEN 'bool:true' WHEN 'false' THEN 'bool:false' \
                 ELSE 'image:' || id END"
            )
        }
        Engine::Postgres => {
            let (v, t) = (pg_value(path), pg_text(path));
            format!(
                "CASE jsonb_typeof({v}) \
                 WHEN 'string' THEN 'str:' || {t} \
                 WHEN 'number' THEN 'num:' || ({v})::float8::text \
                 WHEN 'boolean' THEN 'bool:' || {t} \
                 ELSE 'image:' || id END"
            )
        }
    }
}

/// An integral value binds as an integer (exact past 2^53), anything else as a real.
fn number(x: f64) -> Bind {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        Bind::Int(x as i64)
    } else {
        Bind::Real(x)
    }
}

/// `'$."a"."b"'`: SQLite's JSON path; the segments hold no quote (`FieldPath`).
fn sqlite_path(path: &FieldPath) -> String {
    let quoted: Vec<String> = path.segments().iter().map(|s| format!("\"{s}\"")).collect();
    format!("'$.{}'", quoted.join("."))
}

/// `(metadata -> 'a' -> 'b')`: the jsonb value at a path, walked key by key. `->` with a text key never
/// indexes an array, so "tags.0" names the key "0" as on SQLite and in the in-memory columns (`#>` with
/// '{tags,0}' would read the first tag). The segments hold no quote (`FieldPath`).
fn pg_value(path: &FieldPath) -> String {
    format!("(metadata{})", pg_keys(path.segments()))
}

/// `(metadata -> 'a' ->> 'b')`: the same value as text.
fn pg_text(path: &FieldPath) -> String {
    let (last, parents) = path.segments().split_last().expect("a path has a segment");
    format!("(metadata{} ->> '{last}')", pg_keys(parents))
}

/// ` -> 'a' -> 'b'`: the steps down to a value.
fn pg_keys(segments: &[String]) -> String {
    segments.iter().map(|s| format!(" -> '{s}'")).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn filter(v: serde_json::Value) -> Filter {
        Filter::parse(&v).expect("a valid filter")
    }

    #[test]
    fn sqlite_conditions_check_the_json_type_and_bind_every_value() {
        let f = filter(
            json!({"brand.name": "acme", "in_stock": true, "price": {"$gte": 9.5}, "n": {"$nin": [3, "x"]}}),
        );
        let sql = compile_filter(Engine::Sqlite, &f, 2);
        assert_eq!(
            sql.clause,
            " AND (COALESCE((json_type(metadata, '$.\"brand\".\"name\"') = 'text' AND \
             json_extract(metadata, '$.\"brand\".\"name\"') = $2), 0) AND COALESCE((json_type(metadata, '$.\"in_stock\"') = 'true'), 0) \
             AND (NOT COALESCE(((json_type(metadata, '$.\"n\"') = 'text' AND json_extract(metadata, '$.\"n\"') IN ($3)) OR \
             (json_type(metadata, '$.\"n\"') IN ('integer', 'real') AND json_extract(metadata, '$.\"n\"') IN ($4))), 0)) \
             AND COALESCE((json_type(metadata, '$.\"price\"') IN ('integer', 'real') AND json_extract(metadata, '$.\"price\"') >= $5), 0))"
        );
        assert_eq!(
            sql.binds,
            [
                Bind::Text("acme".into()),
                Bind::Text("x".into()),
                Bind::Int(3),
                Bind::Real(9.5)
            ]
        );
    }

    #[test]
    fn postgres_conditions_compare_jsonb_and_strings_in_byte_order() {
        let f = filter(
            json!({"$or": [{"size": {"$in": ["M", 2]}}, {"name": {"$lt": "m"}}], "tag": {"$exists": false}}),
        );
        let sql = compile_filter(Engine::Postgres, &f, 5);
        assert_eq!(
            sql.clause,
            " AND ((((metadata @> $5::jsonb) OR (metadata @> $6::jsonb)) OR \
             COALESCE((jsonb_typeof(metadata -> 'name') = 'string' AND (metadata ->> 'name') COLLATE \"C\" < $7), false)) \
             AND (NOT ((metadata -> 'tag') IS NOT NULL)))"
        );
        assert_eq!(
            sql.binds,
            [
                Bind::Text(r#"{"size":"M"}"#.into()),
                Bind::Text(r#"{"size":2.0}"#.into()),
                Bind::Text("m".into())
            ]
        );
        assert!(
            compile_filter(Engine::Postgres, &Filter::all(), 2)
                .clause
                .is_empty()
        );
        // Key by key: a digit segment is a key, never an array position (containment of an object under
        // "tags" never matches an array there).
        let f =
            filter(json!({"tags.0": "x", "brand.name": {"$gt": "m"}, "in-stock": {"$ne": true}}));
        let sql = compile_filter(Engine::Postgres, &f, 1);
        assert_eq!(
            sql.clause,
            " AND (COALESCE((jsonb_typeof(metadata -> 'brand' -> 'name') = 'string' AND \
             (metadata -> 'brand' ->> 'name') COLLATE \"C\" > $1), false) AND (NOT (metadata @> $2::jsonb)) AND \
             (metadata @> $3::jsonb))"
        );
        assert_eq!(
            sql.binds,
            [
                Bind::Text("m".into()),
                Bind::Text(r#"{"in-stock":true}"#.into()),
                Bind::Text(r#"{"tags":{"0":"x"}}"#.into())
            ]
        );
    }

    #[test]
    fn placeholders_are_numbered_from_first() {
        assert_eq!(placeholders(2, 3), "$2,$3,$4");
        assert_eq!(placeholders(1, 0), "");
        assert_eq!(json_param(Engine::Postgres, 3), "$3::jsonb");
        assert_eq!(json_param(Engine::Sqlite, 3), "$3");
    }
}
