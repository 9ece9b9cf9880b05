//! Each image's metadata, held in memory beside its vector, so that a filtered search finds the ids a filter
//! admits without the database: reading and parsing every row's JSON there costs 75-130 ms at 100k images on
//! SQLite (docs/benchmarks.md, "Filtered search at 100k"), whatever the filter keeps. Kept in step by the
//! same writes and the same change sequence as the vectors (jointspace-service, admin/follow.rs).
//!
//! A filter is evaluated a column at a time: the values of each field it reads, for every image, are pulled
//! out of the JSON the first time a filter reads that field and kept in step by every write after, so a
//! filter touches flat arrays rather than one JSON tree per image (walking the trees took 10 ms per filter at
//! 100k; the columns 0.6 ms for a 1% filter).

use std::{
    collections::{HashMap, HashSet},
    sync::RwLock,
};

use serde_json::Value;

use crate::filter::{Field, FieldPath, Filter, GroupKey};

/// Columns kept at most; past it they are dropped and built again as read (a caller naming ever new fields
/// must not grow memory without bound).
const MAX_COLUMNS: usize = 32;

/// One image's value of one field, owned (a column's cell).
enum Cell {
    Missing,
    Str(Box<str>),
    Num(f64),
    Bool(bool),
    Other,
}

impl Cell {
    fn of(v: Option<&Value>) -> Cell {
        match Field::of(v) {
            Field::Missing => Cell::Missing,
            Field::Str(s) => Cell::Str(s.into()),
            Field::Num(n) => Cell::Num(n),
            Field::Bool(b) => Cell::Bool(b),
            Field::Other => Cell::Other,
        }
    }

    fn field(&self) -> Field<'_> {
        match self {
            Cell::Missing => Field::Missing,
            Cell::Str(s) => Field::Str(s),
            Cell::Num(n) => Field::Num(*n),
            Cell::Bool(b) => Field::Bool(*b),
            Cell::Other => Field::Other,
        }
    }
}

/// The metadata by row, and columns of the fields filters have read, row for row; writes keep both in step.
#[derive(Default)]
struct Table {
    ids: Vec<i64>,
    pos: HashMap<i64, usize>,
    values: Vec<Value>,
    columns: HashMap<FieldPath, Vec<Cell>>,
}

impl Table {
    fn set(&mut self, id: i64, v: Value) {
        match self.pos.get(&id) {
            Some(&i) => {
                for (path, col) in &mut self.columns {
                    col[i] = Cell::of(path.get(&v));
                }
                self.values[i] = v;
            }
            None => {
                for (path, col) in &mut self.columns {
                    col.push(Cell::of(path.get(&v)));
                }
                self.pos.insert(id, self.ids.len());
                self.ids.push(id);
                self.values.push(v);
            }
        }
    }

    fn remove(&mut self, id: i64) {
        let Some(i) = self.pos.remove(&id) else {
            return;
        };
        self.ids.swap_remove(i);
        self.values.swap_remove(i);
        for col in self.columns.values_mut() {
            col.swap_remove(i);
        }
        if let Some(&moved) = self.ids.get(i) {
            self.pos.insert(moved, i);
        }
    }

    fn has_columns(&self, paths: &[&FieldPath]) -> bool {
        paths.iter().all(|p| self.columns.contains_key(*p))
    }
}

#[derive(Default)]
pub struct Attributes {
    table: RwLock<Table>,
}

impl Attributes {
    pub fn new(rows: impl IntoIterator<Item = (i64, Value)>) -> Attributes {
        let a = Attributes::default();
        a.set(rows);
        a
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets (or replaces) images' metadata.
    pub fn set(&self, rows: impl IntoIterator<Item = (i64, Value)>) {
        let mut t = self.write();
        for (id, v) in rows {
            t.set(id, v);
        }
    }

    pub fn remove(&self, ids: &[i64]) {
        let mut t = self.write();
        for id in ids {
            t.remove(*id);
        }
    }

    /// The images whose metadata `filter` admits.
    pub fn matching(&self, filter: &Filter) -> HashSet<i64> {
        self.with_columns(&filter.paths(), |t| {
            let keep = eval(filter, &t.columns, t.ids.len());
            t.ids
                .iter()
                .zip(keep)
                .filter_map(|(id, k)| k.then_some(*id))
                .collect()
        })
    }

    /// Each of `ids`' product key under `path` (None: the image stands alone, or is not held).
    pub fn keys(&self, path: &FieldPath, ids: &[i64]) -> Vec<Option<GroupKey>> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        ids.iter()
            .map(|id| {
                let i = *t.pos.get(id)?;
                GroupKey::in_metadata(path, &t.values[i])
            })
            .collect()
    }

    /// Every image whose product key under `path` is one of `keys`, with its key, in no order.
    pub fn members(&self, path: &FieldPath, keys: &HashSet<GroupKey>) -> Vec<(i64, GroupKey)> {
        self.with_columns(&[path], |t| {
            t.ids
                .iter()
                .zip(&t.columns[path])
                .filter_map(|(id, cell)| {
                    let k = GroupKey::of(cell.field())?;
                    keys.contains(&k).then_some((*id, k))
                })
                .collect()
        })
    }

    /// How many products the images in `ids` are: one per distinct key under `path`, one per image without.
    pub fn count_products(&self, path: &FieldPath, ids: &HashSet<i64>) -> usize {
        self.with_columns(&[path], |t| {
            let mut keys = HashSet::new();
            let mut alone = 0;
            for (id, cell) in t.ids.iter().zip(&t.columns[path]) {
                if ids.contains(id) {
                    match GroupKey::of(cell.field()) {
                        Some(k) => {
                            keys.insert(k);
                        }
                        None => alone += 1,
                    }
                }
            }
            keys.len() + alone
        })
    }

    /// `f` over the table once it holds a column for each of `paths`.
    fn with_columns<R>(&self, paths: &[&FieldPath], f: impl Fn(&Table) -> R) -> R {
        loop {
            {
                let t = self.table.read().unwrap_or_else(|p| p.into_inner());
                if t.has_columns(paths) {
                    return f(&t);
                }
            }
            // A field not read before: its column, built once (a write may slip in before the read above
            // is taken again; it keeps the column in step).
            let mut t = self.write();
            if t.columns.len() + paths.len() > MAX_COLUMNS {
                t.columns.clear();
            }
            for p in paths {
                if !t.columns.contains_key(*p) {
                    let col = t.values.iter().map(|v| Cell::of(p.get(v))).collect();
                    t.columns.insert((*p).clone(), col);
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .ids
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which of `n` rows `f` keeps, a condition at a time over its field's column.
fn eval(f: &Filter, columns: &HashMap<FieldPath, Vec<Cell>>, n: usize) -> Vec<bool> {
    match f {
        Filter::And(parts) | Filter::Or(parts) if parts.is_empty() => vec![true; n],
        Filter::And(parts) | Filter::Or(parts) => {
            let and = matches!(f, Filter::And(_));
            let mut acc = eval(&parts[0], columns, n);
            for p in &parts[1..] {
                for (a, b) in acc.iter_mut().zip(eval(p, columns, n)) {
                    *a = if and { *a && b } else { *a || b };
                }
            }
            acc
        }
        Filter::Not(inner) => eval(inner, columns, n).into_iter().map(|b| !b).collect(),
        Filter::Compare(path, ..) | Filter::In(path, ..) | Filter::Exists(path, _) => {
            let col = &columns[path];
            col.iter().map(|c| f.test(c.field())).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn filter(v: Value) -> Filter {
        Filter::parse(&v).expect("filter")
    }

    #[test]
    fn follows_sets_and_removes() {
        let a = Attributes::new([(1, json!({"price": 5})), (2, json!({"price": 50}))]);
        let cheap = filter(json!({"price": {"$lt": 10}}));
        assert_eq!(a.matching(&cheap), HashSet::from([1]));
        // A write after the columns were built: they are built again.
        a.set([(2, json!({"price": 7})), (3, json!({}))]);
        assert_eq!(a.matching(&cheap), HashSet::from([1, 2]));
        a.remove(&[1]);
        assert_eq!(a.matching(&cheap), HashSet::from([2]));
        let not_cheap = filter(json!({"$not": {"price": {"$lt": 10}}}));
        assert_eq!(a.matching(&not_cheap), HashSet::from([3]));
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn products_by_key() {
        let a = Attributes::new([
            (1, json!({"sku": "a"})),
            (2, json!({"sku": "a"})),
            (3, json!({"sku": 3})),
            (4, json!({"sku": "3"})),
            (5, json!({})),
            (6, json!({"sku": null})),
        ]);
        let p = FieldPath::parse("sku").unwrap();
        let str_a = GroupKey::Str("a".into());
        assert_eq!(
            a.keys(&p, &[2, 5, 99]),
            vec![Some(str_a.clone()), None, None]
        );
        let mut m = a.members(
            &p,
            &HashSet::from([str_a.clone(), GroupKey::Str("3".into())]),
        );
        m.sort_by_key(|x| x.0);
        assert_eq!(
            m,
            vec![
                (1, str_a.clone()),
                (2, str_a),
                (4, GroupKey::Str("3".into()))
            ]
        );
        // "a" twice is one product; 3 and "3" are two; each image without a key is one.
        assert_eq!(a.count_products(&p, &HashSet::from([1, 2, 3, 4, 5, 6])), 5);
        assert_eq!(a.count_products(&p, &HashSet::from([1, 2])), 1);
        // A write under the built column moves the image to another product.
        a.set([(2, json!({"sku": "b"}))]);
        assert_eq!(a.count_products(&p, &HashSet::from([1, 2])), 2);
    }

    /// The columns give what the filter gives row by row, for logic over several fields, after writes that
    /// change, add and remove rows under built columns, and with the columns dropped past their bound.
    #[test]
    fn columns_agree_with_the_rows() {
        let meta = |i: i64| {
            let s = ["a", "b", "c"][i as usize % 3];
            let mut m = json!({"n": i % 17, "s": s, "in": i % 2 == 0});
            if i % 5 == 0 {
                m["deep"] = json!({"x": i});
            }
            if i % 7 == 0 {
                m["n"] = json!(null);
            }
            m
        };
        let mut rows: HashMap<i64, Value> = (0..500).map(|i| (i, meta(i))).collect();
        let a = Attributes::new(rows.clone());
        let filters = [
            json!({"n": {"$gte": 3, "$lt": 9}}),
            json!({"$or": [{"s": "a"}, {"deep.x": {"$gt": 100}}]}),
            json!({"$not": {"in": true}, "s": {"$nin": ["b"]}}),
            json!({"n": {"$exists": true}, "deep": {"$exists": false}}),
            json!({"n": {"$ne": 4}}),
        ];
        for round in 0..3 {
            for (i, f) in filters.iter().enumerate() {
                let f = filter(f.clone());
                let want: HashSet<i64> = rows
                    .iter()
                    .filter(|(_, m)| f.matches(m))
                    .map(|(id, _)| *id)
                    .collect();
                assert!(!want.is_empty() && want.len() < rows.len(), "{i}");
                assert_eq!(a.matching(&f), want, "filter {i}, round {round}");
            }
            // Writes under the built columns: changed in place, removed (the last row moves), added.
            let changed: Vec<(i64, Value)> =
                (0..500).step_by(11).map(|i| (i, meta(i + 1))).collect();
            let gone: Vec<i64> = (round * 3..500).step_by(13).collect();
            let added: Vec<(i64, Value)> =
                (0..40).map(|i| (1000 * (round + 1) + i, meta(i))).collect();
            a.set(changed.clone());
            a.remove(&gone);
            a.set(added.clone());
            rows.extend(changed);
            for g in &gone {
                rows.remove(g);
            }
            rows.extend(added);
            assert_eq!(a.len(), rows.len());
            if round == 1 {
                // Past the bound with fields no image has: the columns are dropped and built again.
                for k in 0..MAX_COLUMNS {
                    let f = filter(json!({ format!("f{k}"): 1 }));
                    assert!(a.matching(&f).is_empty());
                }
            }
        }
    }
}
