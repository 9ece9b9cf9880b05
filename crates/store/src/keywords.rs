//! The keyword index of hybrid search: per image, one text made of its captions, its external id and the
//! metadata fields its collection declares searchable (`text_fields`), full-text indexed by the engine
//! (SQLite FTS5 with the Porter stemmer; Postgres' English tsvector under a GIN index). Every write that
//! changes one of those rewrites the image's text in its own transaction, so the keyword index is never
//! behind the data, here or on any replica.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::Row;

use super::{Engine, Store, StoreError, Tx, dialect};
use crate::filter::{FieldPath, Filter};
use jointspace_core::TextField;

/// A keyword query, parsed once from the user's sentence: its words, each a phrase of the letter-and-digit
/// runs it holds ("sku-4411" is the phrase "sku 4411"). Words end at white space and at punctuation that
/// separates words in prose ("Mercury—the planet", "red/blue", "shoes,socks"); a hyphen, underscore, full stop
/// or apostrophe inside a word joins its runs into the phrase. Only letters and digits reach the engine's query
/// language, as a bound parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeywordQuery(Vec<Vec<String>>);

/// At most this many words of a sentence are searched.
const MAX_WORDS: usize = 32;

/// Postgres: a word the table's statistics put in more rows than this is common, and matches only where
/// every word of the sentence does (Elasticsearch's common-terms query). Ranking every image that holds
/// "red" or "man" cost 80 ms of Postgres CPU a search at 100k titles; the rare words and the images holding
/// them all are what a keyword finds that the vector channels do not.
const COMMON_ROWS: u32 = 1000;

impl KeywordQuery {
    pub fn parse(text: &str) -> KeywordQuery {
        let joins = |c: char| matches!(c, '-' | '\u{2010}' | '_' | '.' | '\'' | '\u{2019}');
        KeywordQuery(
            text.split(|c: char| !c.is_alphanumeric() && !joins(c))
                .map(|w| {
                    w.split(|c: char| !c.is_alphanumeric())
                        .filter(|t| !t.is_empty())
                        .map(str::to_lowercase)
                        .collect::<Vec<_>>()
                })
                .filter(|p| !p.is_empty())
                .take(MAX_WORDS)
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// FTS5: any of the phrases (`"sku 4411" OR "red"`).
    fn fts5(&self) -> String {
        self.0
            .iter()
            .map(|p| format!("\"{}\"", p.join(" ")))
            .collect::<Vec<_>>()
            .join(" OR ")
    }

    /// The phrases as words, comma-separated (`sku 4411,red`): what Postgres reads each phrase's lexemes from.
    fn phrases(&self) -> String {
        self.0
            .iter()
            .map(|p| p.join(" "))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// to_tsquery: any of the phrases (`'sku' <-> '4411' | 'red'`).
    fn tsquery(&self) -> String {
        self.0
            .iter()
            .map(|p| {
                let phrase: Vec<String> = p.iter().map(|t| format!("'{t}'")).collect();
                format!("({})", phrase.join(" <-> "))
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// The text an image is found by.
fn body(
    captions: &[String],
    external_id: Option<&str>,
    metadata: &Value,
    fields: &[FieldPath],
) -> String {
    let mut parts: Vec<String> = captions.to_vec();
    parts.extend(external_id.map(str::to_string));
    for f in fields {
        match f.get(metadata) {
            Some(Value::String(s)) => parts.push(s.clone()),
            Some(Value::Array(a)) => parts.extend(a.iter().filter_map(|v| match v {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })),
            Some(Value::Number(n)) => parts.push(n.to_string()),
            _ => {}
        }
    }
    // Punctuation becomes space, as the query's words are split: Postgres' parser would read "sku-4411" as
    // "sku" and the signed number "-4411", which the phrase "sku 4411" never matches.
    parts
        .join("\n")
        .chars()
        .map(|c| if c.is_alphanumeric() { c } else { ' ' })
        .collect()
}

/// A collection's searchable fields as stored (`None`: keyword search not asked for): a JSON list of
/// `TextField`s, a bare path for a field of weight 1 (how every field was stored before weights).
pub(super) fn parse_fields(stored: Option<String>) -> Option<Vec<TextField>> {
    stored.and_then(|s| serde_json::from_str(&s).ok())
}

/// The stored form `parse_fields` reads.
pub(super) fn write_fields(fields: &[TextField]) -> String {
    serde_json::json!(fields).to_string()
}

impl Store {
    /// Rewrites the keyword text of `ids` (images of one collection) from what the transaction sees.
    pub(super) async fn refresh_text(
        &self,
        tx: &mut Tx<'_>,
        collection_id: i64,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let stored: Option<String> =
            sqlx::query_scalar("SELECT text_fields FROM collections WHERE id = $1")
                .bind(collection_id)
                .fetch_optional(&mut **tx)
                .await?
                .flatten();
        let fields: Vec<FieldPath> = parse_fields(stored)
            .unwrap_or_default()
            .iter()
            .filter_map(|f| FieldPath::parse(&f.path).ok())
            .collect();
        let meta = dialect::metadata_text(self.engine, "");
        Self::forget_text_tx(tx, self.engine, ids).await?;
        for chunk in ids.chunks(500) {
            let list = dialect::placeholders(1, chunk.len());
            let sql = format!("SELECT id, external_id, {meta} FROM images WHERE id IN ({list})");
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            let images: Vec<(i64, Option<String>, String)> = q
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|r| (r.get("id"), r.get("external_id"), r.get("metadata")))
                .collect();
            let sql = format!(
                "SELECT image_id, text FROM captions WHERE image_id IN ({list}) AND field IS NULL ORDER BY id"
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            let mut caps: HashMap<i64, Vec<String>> = HashMap::new();
            for r in q.fetch_all(&mut **tx).await? {
                caps.entry(r.get("image_id"))
                    .or_default()
                    .push(r.get("text"));
            }
            let insert = match self.engine {
                Engine::Sqlite => {
                    "INSERT INTO image_text (rowid, collection_id, body) VALUES ($1, $2, $3)"
                }
                Engine::Postgres => {
                    "INSERT INTO image_text (image_id, collection_id, body) VALUES ($1, $2, $3)"
                }
            };
            for (id, external_id, metadata) in images {
                let metadata: Value = serde_json::from_str(&metadata).unwrap_or(Value::Null);
                let text = body(
                    caps.get(&id).map(Vec::as_slice).unwrap_or_default(),
                    external_id.as_deref(),
                    &metadata,
                    &fields,
                );
                sqlx::query(insert)
                    .bind(id)
                    .bind(collection_id)
                    .bind(text)
                    .execute(&mut **tx)
                    .await?;
            }
        }
        Ok(())
    }

    /// Drops the keyword text of deleted images (Postgres' rows go with their image; FTS5 has no foreign keys).
    pub(super) async fn forget_text_tx(
        tx: &mut Tx<'_>,
        engine: Engine,
        ids: &[i64],
    ) -> Result<(), StoreError> {
        let column = match engine {
            Engine::Sqlite => "rowid",
            Engine::Postgres => "image_id",
        };
        for chunk in ids.chunks(500) {
            let sql = format!(
                "DELETE FROM image_text WHERE {column} IN ({})",
                dialect::placeholders(1, chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// The collection's images ranked by keyword relevance (higher is better), at most `limit`, among those
    /// `filter` admits.
    pub async fn keyword_search(
        &self,
        collection_id: i64,
        query: &KeywordQuery,
        filter: &Filter,
        limit: usize,
    ) -> Result<Vec<(i64, f32)>, StoreError> {
        if query.is_empty() {
            return Ok(vec![]);
        }
        // Postgres binds the phrases third, then the filter's values.
        let f = dialect::compile_filter(
            self.engine,
            filter,
            if self.engine == Engine::Postgres {
                4
            } else {
                3
            },
        );
        let sql = match self.engine {
            Engine::Sqlite => format!(
                "SELECT t.rowid AS id, -bm25(image_text) AS rank FROM image_text t JOIN images ON images.id = t.rowid \
                 WHERE image_text MATCH $1 AND t.collection_id = $2{} ORDER BY bm25(image_text) LIMIT {limit}",
                f.clause
            ),
            // Ranked by every phrase; matched by the rare ones (each phrase's rows estimated from the
            // statistics' most common lexemes, its rarest lexeme's) and by all of them together.
            Engine::Postgres => format!(
                "WITH st AS MATERIALIZED (SELECT s.most_common_elems::text::text[] AS e, s.most_common_elem_freqs AS f, \
                   c.reltuples AS n FROM pg_stats s, pg_class c WHERE s.schemaname = current_schema() \
                   AND s.tablename = 'image_text' AND s.attname = 'tsv' AND c.oid = 'image_text'::regclass), \
                 ph AS (SELECT '(' || phraseto_tsquery('english', w)::text || ')' AS q, \
                   COALESCE((SELECT min(COALESCE(st.f[array_position(st.e, l)], 0) * st.n) FROM st, \
                     unnest(tsvector_to_array(to_tsvector('english', w))) l), 0) AS rows \
                   FROM string_to_table($3, ',') w WHERE length(to_tsvector('english', w)) > 0), \
                 m AS (SELECT concat_ws(' | ', string_agg(q, ' | ') FILTER (WHERE rows <= {COMMON_ROWS}), \
                   '(' || string_agg(q, ' & ') || ')')::tsquery AS mq FROM ph) \
                 SELECT t.image_id AS id, ts_rank_cd(t.tsv, q)::float8 AS rank \
                 FROM m, image_text t JOIN images ON images.id = t.image_id, to_tsquery('english', $1) q \
                 WHERE t.tsv @@ m.mq AND t.collection_id = $2{} ORDER BY rank DESC, t.image_id LIMIT {limit}",
                f.clause
            ),
        };
        let text = match self.engine {
            Engine::Sqlite => query.fts5(),
            Engine::Postgres => query.tsquery(),
        };
        let mut q = sqlx::query(&sql).bind(text).bind(collection_id);
        if self.engine == Engine::Postgres {
            q = q.bind(query.phrases());
        }
        let q = f.bind(q);
        Ok(q.fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| (r.get::<i64, _>("id"), r.get::<f64, _>("rank") as f32))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_sentence_becomes_phrases_of_letters_and_digits_only() {
        let q = KeywordQuery::parse("Red  SKU-4411 \"shoes\" OR (nike)'; DROP --");
        assert_eq!(
            q.0,
            vec![
                vec!["red".to_string()],
                vec!["sku".into(), "4411".into()],
                vec!["shoes".into()],
                vec!["or".into()],
                vec!["nike".into()],
                vec!["drop".into()],
            ]
        );
        assert_eq!(
            q.fts5(),
            "\"red\" OR \"sku 4411\" OR \"shoes\" OR \"or\" OR \"nike\" OR \"drop\""
        );
        assert!(q.tsquery().starts_with("('red') | ('sku' <-> '4411')"));
        assert!(KeywordQuery::parse(" -- ' ").is_empty());
        // Prose punctuation ends a word; joiners inside one keep its phrase.
        let q = KeywordQuery::parse(
            "Mercury\u{2014}the planet, red/blue t-shirt\u{2026}don\u{2019}t 4.5",
        );
        assert_eq!(
            q.fts5(),
            "\"mercury\" OR \"the\" OR \"planet\" OR \"red\" OR \"blue\" OR \"t shirt\" OR \"don t\" OR \"4 5\""
        );
    }

    #[test]
    fn an_images_text_is_its_captions_id_and_declared_fields() {
        let fields: Vec<FieldPath> = ["title", "brand.name", "tags", "size"]
            .iter()
            .map(|f| FieldPath::parse(f).expect("path"))
            .collect();
        let meta = json!({"title": "Espadrille", "brand": {"name": "Acme"}, "tags": ["summer", 2026], "price": 3, "size": 41});
        let text = body(&["a red shoe".into()], Some("sku-1"), &meta, &fields);
        assert_eq!(text, "a red shoe sku 1 Espadrille Acme summer 2026 41");
        assert!(!text.contains('3'), "undeclared fields stay out");
    }
}
