//! A metadata filter, parsed once from the caller's JSON: what the API takes and the store compiles to SQL for
//! either engine (`store::dialect`). The syntax is MongoDB's query subset that catalogues need:
//!
//! - `{"size": "M"}`: equality; `{"brand.name": "acme"}`: a dotted path into nested objects;
//! - `{"price": {"$gte": 10, "$lt": 50}}`: `$eq $ne $gt $gte $lt $lte` (several operators on one field all
//!   hold), `{"size": {"$in": ["M", "L"]}}`, `$nin`, `{"discontinued": {"$exists": false}}`;
//! - `{"$and": [..]}`, `{"$or": [..]}`, `{"$not": {..}}`; keys side by side all hold.
//!
//! Values are strings, numbers or booleans, compared by type: `true` is not `1`, `"5"` is not `5`. As in
//! MongoDB, `$ne` and `$nin` also match an image that lacks the field. `$gt` and friends order numbers
//! numerically and strings by their bytes, and never match a value of another type.

use serde_json::Value;

/// Nesting and size limits: a filter is a few conditions, not a program.
const MAX_DEPTH: usize = 8;
const MAX_CONDITIONS: usize = 64;
const MAX_IN: usize = 256;
const MAX_SEGMENTS: usize = 8;

/// A dotted path into the metadata, each segment 1-64 of `[A-Za-z0-9_-]` (so it can be written into SQL as a
/// JSON path literal without quoting: see `store::dialect`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// A dotted path into metadata, checked as filters check theirs.
    pub fn parse(field: &str) -> Result<FieldPath, FilterError> {
        parse_path(field, field)
    }

    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// The value at this path in `v`, if any.
    pub fn get<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        self.0.iter().try_fold(v, |v, s| v.get(s))
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(String),
    Num(f64),
    Bool(bool),
}

impl Scalar {
    /// The value as JSON text (what Postgres compares as jsonb).
    pub fn json(&self) -> String {
        match self {
            Scalar::Str(s) => Value::String(s.clone()).to_string(),
            Scalar::Num(n) => serde_json::Number::from_f64(*n)
                .map(|n| n.to_string())
                .unwrap_or_else(|| "null".into()),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    /// Every one holds (an empty list: everything matches).
    And(Vec<Filter>),
    Or(Vec<Filter>),
    Not(Box<Filter>),
    Compare(FieldPath, Cmp, Scalar),
    /// The field's value is one of these (`negated`: it is none of them, or the field is missing).
    In(FieldPath, Vec<Scalar>, bool),
    Exists(FieldPath, bool),
}

/// A filter the server cannot run, with where in it the problem is (`at`: e.g. `price.$gte`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter at \"{at}\": {message}")]
pub struct FilterError {
    pub at: String,
    pub message: String,
}

fn err(at: &str, message: impl Into<String>) -> FilterError {
    FilterError {
        at: if at.is_empty() {
            "(top)".into()
        } else {
            at.into()
        },
        message: message.into(),
    }
}

impl Filter {
    /// Matches everything.
    pub fn all() -> Filter {
        Filter::And(vec![])
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Filter::And(v) if v.is_empty())
    }

    /// Parses the caller's JSON (an object; `null` is no filter).
    pub fn parse(v: &Value) -> Result<Filter, FilterError> {
        let mut count = 0;
        match v {
            Value::Null => Ok(Filter::all()),
            _ => parse_object(v, "", 0, &mut count),
        }
    }
}

/// A metadata field's value as a condition sees it: missing, a comparable scalar, or something else there
/// (null, an array, an object), which exists but equals and orders against nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Field<'a> {
    Missing,
    Str(&'a str),
    Num(f64),
    Bool(bool),
    Other,
}

impl<'a> Field<'a> {
    pub fn of(v: Option<&'a Value>) -> Field<'a> {
        match v {
            None => Field::Missing,
            Some(Value::String(s)) => Field::Str(s),
            Some(Value::Number(n)) => n.as_f64().map_or(Field::Other, Field::Num),
            Some(Value::Bool(b)) => Field::Bool(*b),
            Some(_) => Field::Other,
        }
    }
}

/// A product key: the value of a collection's `group_by` field, compared as filters compare (by JSON type, so
/// `"5"` is not `5`). Only a string, a number or a boolean names a product; an image with anything else there,
/// or nothing, is a product of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GroupKey {
    Str(String),
    /// The number's bits (-0 read as 0), so equal numbers hash alike.
    Num(u64),
    Bool(bool),
}

impl GroupKey {
    pub fn of(x: Field<'_>) -> Option<GroupKey> {
        match x {
            Field::Str(s) => Some(GroupKey::Str(s.to_string())),
            Field::Num(n) => Some(GroupKey::Num((n + 0.0).to_bits())),
            Field::Bool(b) => Some(GroupKey::Bool(b)),
            Field::Missing | Field::Other => None,
        }
    }

    /// The key of an image's metadata under `path`.
    pub fn in_metadata(path: &FieldPath, metadata: &Value) -> Option<GroupKey> {
        GroupKey::of(Field::of(path.get(metadata)))
    }

    /// The value a filter compares with: `Filter::In(path, keys)` finds a product's photos.
    pub fn scalar(&self) -> Scalar {
        match self {
            GroupKey::Str(s) => Scalar::Str(s.clone()),
            GroupKey::Num(bits) => Scalar::Num(f64::from_bits(*bits)),
            GroupKey::Bool(b) => Scalar::Bool(*b),
        }
    }
}

/// The key as the API shows it: a string as it is, an integral number without a fraction, others as JSON
/// writes them.
impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupKey::Str(s) => f.write_str(s),
            GroupKey::Num(bits) => {
                let n = f64::from_bits(*bits);
                if n.fract() == 0.0 && n.abs() < 9.0e15 {
                    write!(f, "{}", n as i64)
                } else {
                    f.write_str(&self.scalar().json())
                }
            }
            GroupKey::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl Filter {
    /// Whether `metadata` matches: the same answer as the SQL the store compiles (`store::dialect`), which
    /// tests/it/filters.rs checks on both engines. A comparison with a missing field, or one of another JSON
    /// type, is false, so `$ne`, `$nin` and `$not` match images that lack the field.
    pub fn matches(&self, metadata: &Value) -> bool {
        match self {
            Filter::And(parts) => parts.iter().all(|f| f.matches(metadata)),
            Filter::Or(parts) => parts.is_empty() || parts.iter().any(|f| f.matches(metadata)),
            Filter::Not(inner) => !inner.matches(metadata),
            Filter::Compare(path, ..) | Filter::In(path, ..) | Filter::Exists(path, _) => {
                self.test(Field::of(path.get(metadata)))
            }
        }
    }

    /// Whether a condition holds for its field's value (`$and`, `$or` and `$not` hold no field: false).
    pub fn test(&self, x: Field<'_>) -> bool {
        match self {
            Filter::Compare(_, Cmp::Ne, v) => !compare(x, Cmp::Eq, v),
            Filter::Compare(_, cmp, v) => compare(x, *cmp, v),
            Filter::In(_, values, negated) => {
                values.iter().any(|v| compare(x, Cmp::Eq, v)) != *negated
            }
            Filter::Exists(_, exists) => (x != Field::Missing) == *exists,
            Filter::And(_) | Filter::Or(_) | Filter::Not(_) => false,
        }
    }

    /// The distinct fields the filter's conditions read.
    pub fn paths(&self) -> Vec<&FieldPath> {
        fn walk<'a>(f: &'a Filter, out: &mut Vec<&'a FieldPath>) {
            match f {
                Filter::And(parts) | Filter::Or(parts) => parts.iter().for_each(|p| walk(p, out)),
                Filter::Not(inner) => walk(inner, out),
                Filter::Compare(path, ..) | Filter::In(path, ..) | Filter::Exists(path, _) => {
                    if !out.contains(&path) {
                        out.push(path);
                    }
                }
            }
        }
        let mut out = vec![];
        walk(self, &mut out);
        out
    }
}

/// A field's value against a scalar of the same JSON type: numbers by value, strings by their bytes (as
/// SQLite's BINARY and Postgres' "C" collation order them), booleans for equality only.
fn compare(x: Field<'_>, cmp: Cmp, v: &Scalar) -> bool {
    use std::cmp::Ordering;
    let ord = match (x, v) {
        (Field::Str(a), Scalar::Str(b)) => a.cmp(b.as_str()),
        (Field::Num(a), Scalar::Num(b)) => match a.partial_cmp(b) {
            Some(o) => o,
            None => return false,
        },
        (Field::Bool(a), Scalar::Bool(b)) if a == *b => Ordering::Equal,
        _ => return false,
    };
    match cmp {
        Cmp::Eq | Cmp::Ne => ord == Ordering::Equal,
        Cmp::Gt => ord == Ordering::Greater,
        Cmp::Gte => ord != Ordering::Less,
        Cmp::Lt => ord == Ordering::Less,
        Cmp::Lte => ord != Ordering::Greater,
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn parse_object(
    v: &Value,
    at: &str,
    depth: usize,
    count: &mut usize,
) -> Result<Filter, FilterError> {
    if depth > MAX_DEPTH {
        return Err(err(at, format!("nested more than {MAX_DEPTH} levels deep")));
    }
    let Value::Object(m) = v else {
        return Err(err(
            at,
            format!(
                "expected an object such as {{\"color\": \"red\"}}, got {}",
                kind(v)
            ),
        ));
    };
    let mut all = Vec::with_capacity(m.len());
    for (k, v) in m {
        let here = join(at, k);
        match k.as_str() {
            "$and" | "$or" => {
                let items = list(v, &here, "filters")?;
                if items.is_empty() {
                    return Err(err(&here, "expects at least one filter"));
                }
                let parts = each(items, &here, |f, at| parse_object(f, at, depth + 1, count))?;
                all.push(if k == "$and" {
                    Filter::And(parts)
                } else {
                    Filter::Or(parts)
                });
            }
            "$not" => all.push(Filter::Not(Box::new(parse_object(
                v,
                &here,
                depth + 1,
                count,
            )?))),
            op if op.starts_with('$') => {
                return Err(err(
                    &here,
                    "unknown operator here: at the top level use $and, $or or $not, or a field name",
                ));
            }
            field => {
                let path = parse_path(field, &here)?;
                all.extend(parse_conditions(path, v, &here, count)?);
            }
        }
    }
    Ok(if all.len() == 1 {
        all.pop().expect("one")
    } else {
        Filter::And(all)
    })
}

fn parse_path(field: &str, at: &str) -> Result<FieldPath, FilterError> {
    let segments: Vec<String> = field.split('.').map(str::to_string).collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(err(
            at,
            format!("a path has at most {MAX_SEGMENTS} segments"),
        ));
    }
    for s in &segments {
        if s.is_empty()
            || s.len() > 64
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(err(
                at,
                format!(
                    "field \"{field}\" is not allowed: each dot-separated part must be 1-64 letters, digits, '_' or '-'"
                ),
            ));
        }
    }
    Ok(FieldPath(segments))
}

/// A field's conditions: a bare value (equality) or an object of operators.
fn parse_conditions(
    path: FieldPath,
    v: &Value,
    at: &str,
    count: &mut usize,
) -> Result<Vec<Filter>, FilterError> {
    let mut bump = |at: &str| {
        *count += 1;
        if *count > MAX_CONDITIONS {
            Err(err(
                at,
                format!("a filter holds at most {MAX_CONDITIONS} conditions"),
            ))
        } else {
            Ok(())
        }
    };
    let Value::Object(ops) = v else {
        bump(at)?;
        return Ok(vec![Filter::Compare(path, Cmp::Eq, scalar(v, at)?)]);
    };
    if ops.is_empty() {
        return Err(err(
            at,
            "expects a value or operators such as {\"$gte\": 10}",
        ));
    }
    let mut out = Vec::with_capacity(ops.len());
    for (op, arg) in ops {
        let here = format!("{at}.{op}");
        bump(&here)?;
        let cmp = match op.as_str() {
            "$eq" => Some(Cmp::Eq),
            "$ne" => Some(Cmp::Ne),
            "$gt" => Some(Cmp::Gt),
            "$gte" => Some(Cmp::Gte),
            "$lt" => Some(Cmp::Lt),
            "$lte" => Some(Cmp::Lte),
            _ => None,
        };
        if let Some(cmp) = cmp {
            let s = scalar(arg, &here)?;
            if matches!(cmp, Cmp::Gt | Cmp::Gte | Cmp::Lt | Cmp::Lte)
                && matches!(s, Scalar::Bool(_))
            {
                return Err(err(&here, "orders numbers or strings, not booleans"));
            }
            out.push(Filter::Compare(path.clone(), cmp, s));
            continue;
        }
        match op.as_str() {
            "$in" | "$nin" => {
                let items = list(arg, &here, "values")?;
                if items.is_empty() || items.len() > MAX_IN {
                    return Err(err(&here, format!("expects 1 to {MAX_IN} values")));
                }
                let values = each(items, &here, scalar)?;
                out.push(Filter::In(path.clone(), values, op == "$nin"));
            }
            "$exists" => match arg {
                Value::Bool(b) => out.push(Filter::Exists(path.clone(), *b)),
                _ => {
                    return Err(err(
                        &here,
                        format!("expects true or false, got {}", kind(arg)),
                    ));
                }
            },
            _ => {
                return Err(err(
                    &here,
                    "unknown operator: use $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin or $exists",
                ));
            }
        }
    }
    Ok(out)
}

/// `v` as a list, or the error that it should be a list of `what`.
fn list<'a>(v: &'a Value, at: &str, what: &str) -> Result<&'a [Value], FilterError> {
    match v {
        Value::Array(items) => Ok(items),
        _ => Err(err(
            at,
            format!("expects a list of {what}, got {}", kind(v)),
        )),
    }
}

/// Parses each item of a list found at `at`, naming the item's place `at[i]`.
fn each<T>(
    items: &[Value],
    at: &str,
    mut parse: impl FnMut(&Value, &str) -> Result<T, FilterError>,
) -> Result<Vec<T>, FilterError> {
    items
        .iter()
        .enumerate()
        .map(|(i, x)| parse(x, &format!("{at}[{i}]")))
        .collect()
}

fn scalar(v: &Value, at: &str) -> Result<Scalar, FilterError> {
    match v {
        Value::String(s) => Ok(Scalar::Str(s.clone())),
        Value::Bool(b) => Ok(Scalar::Bool(*b)),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Scalar::Num)
            .ok_or_else(|| err(at, "a number out of range")),
        _ => Err(err(
            at,
            format!(
                "only strings, numbers and booleans can be matched, got {}",
                kind(v)
            ),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_keys_compare_by_json_type() {
        let p = FieldPath::parse("product.id").unwrap();
        let key = |v: Value| GroupKey::in_metadata(&p, &json!({ "product": { "id": v } }));
        assert_eq!(key(json!("p-1")), Some(GroupKey::Str("p-1".into())));
        assert_ne!(key(json!("5")), key(json!(5)));
        assert_eq!(key(json!(5)), key(json!(5.0)));
        assert_eq!(key(json!(-0.0)), key(json!(0)));
        assert_eq!(key(json!(null)), None);
        assert_eq!(key(json!(["a"])), None);
        assert_eq!(GroupKey::in_metadata(&p, &json!({})), None);
        assert_eq!(key(json!(5)).unwrap().to_string(), "5");
        assert_eq!(key(json!(2.5)).unwrap().to_string(), "2.5");
        assert_eq!(key(json!(true)).unwrap().to_string(), "true");
        let f = Filter::In(p.clone(), vec![key(json!(7)).unwrap().scalar()], false);
        assert!(f.matches(&json!({ "product": { "id": 7 } })));
        assert!(!f.matches(&json!({ "product": { "id": "7" } })));
    }

    use serde_json::json;

    use super::*;

    fn p(s: &str) -> FieldPath {
        FieldPath(s.split('.').map(str::to_string).collect())
    }

    #[test]
    fn bare_values_operators_paths_and_logic_parse_into_one_tree() {
        let f = Filter::parse(&json!({
            "size": "M",
            "brand.name": {"$in": ["acme", "zeta"]},
            "price": {"$gte": 10, "$lt": 50},
            "$or": [{"in_stock": true}, {"discontinued": {"$exists": false}}],
            "$not": {"color": {"$ne": "red"}}
        }))
        .expect("parses");
        // serde_json's map is ordered by key.
        assert_eq!(
            f,
            Filter::And(vec![
                Filter::Not(Box::new(Filter::Compare(
                    p("color"),
                    Cmp::Ne,
                    Scalar::Str("red".into())
                ))),
                Filter::Or(vec![
                    Filter::Compare(p("in_stock"), Cmp::Eq, Scalar::Bool(true)),
                    Filter::Exists(p("discontinued"), false),
                ]),
                Filter::In(
                    p("brand.name"),
                    vec![Scalar::Str("acme".into()), Scalar::Str("zeta".into())],
                    false
                ),
                Filter::Compare(p("price"), Cmp::Gte, Scalar::Num(10.0)),
                Filter::Compare(p("price"), Cmp::Lt, Scalar::Num(50.0)),
                Filter::Compare(p("size"), Cmp::Eq, Scalar::Str("M".into())),
            ])
        );
        assert!(Filter::parse(&json!({})).expect("empty").is_all());
        assert!(Filter::parse(&Value::Null).expect("null").is_all());
    }

    #[test]
    fn a_bad_filter_names_the_offending_path_and_operator() {
        for (bad, at, says) in [
            (
                json!({"price": {"$gtx": 1}}),
                "price.$gtx",
                "unknown operator",
            ),
            (json!({"price": {"$gt": true}}), "price.$gt", "not booleans"),
            (json!({"size": {"$in": "M"}}), "size.$in", "list of values"),
            (
                json!({"size": {"$in": [["M"]]}}),
                "size.$in[0]",
                "only strings",
            ),
            (
                json!({"$or": [{"a": 1}, 3]}),
                "$or[1]",
                "expected an object",
            ),
            (json!({"$or": []}), "$or", "at least one"),
            (json!({"$where": "1"}), "$where", "unknown operator here"),
            (json!({"a'b": 1}), "a'b", "is not allowed"),
            (json!({"a..b": 1}), "a..b", "is not allowed"),
            (json!({"a": null}), "a", "only strings"),
            (json!({"a": {"$exists": 1}}), "a.$exists", "true or false"),
            (json!({"a": {}}), "a", "operators"),
            (json!([1]), "(top)", "expected an object"),
        ] {
            let e = Filter::parse(&bad).expect_err(&bad.to_string());
            assert_eq!(e.at, at, "{bad}: {e}");
            assert!(e.message.contains(says), "{bad}: {e}");
        }
        let deep = (0..10).fold(json!({"a": 1}), |f, _| json!({"$not": f}));
        assert!(
            Filter::parse(&deep)
                .expect_err("deep")
                .message
                .contains("levels deep")
        );
        let many: serde_json::Map<String, Value> =
            (0..65).map(|i| (format!("k{i}"), json!(i))).collect();
        assert!(
            Filter::parse(&Value::Object(many))
                .expect_err("many")
                .message
                .contains("at most 64")
        );
    }
}
