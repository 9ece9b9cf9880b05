//! A catalogue feed read and checked: CSV (a header row, then one product per record) or JSON lines (one
//! object per line), each product's id, photos and captions taken out by the mapping and every other field
//! kept as metadata. The whole feed is read before anything is written, so a bad line is refused with its
//! number, together with every other bad line (up to a point: one fix often mends them all).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Result, ServiceError};

/// How a feed's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedFormat {
    /// A header row naming the columns, then one product per record (RFC 4180 quoting).
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl FeedFormat {
    /// JSON lines when the first character that is not white space is `{`, else CSV.
    pub fn sniff(head: &[u8]) -> FeedFormat {
        match head.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => FeedFormat::Jsonl,
            _ => FeedFormat::Csv,
        }
    }
}

/// Which fields of a feed hold what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedMapping {
    pub format: FeedFormat,
    /// The product's id (the image's external id).
    pub id_field: String,
    /// The photo's path or URL, or a list of them.
    pub image_field: String,
    /// Captions: a JSON array of strings (or one string); in CSV separated by `|`.
    pub captions_field: String,
    /// Fields whose text is also added as a caption.
    pub caption_fields: Vec<String>,
    /// CSV columns read as numbers (JSON lines carry their own types).
    pub number_fields: Vec<String>,
}

impl FeedMapping {
    /// The default field names (`id`, `image`, `captions`) for a feed of `format`.
    pub fn new(format: FeedFormat) -> FeedMapping {
        FeedMapping {
            format,
            id_field: "id".into(),
            image_field: "image".into(),
            captions_field: "captions".into(),
            caption_fields: vec![],
            number_fields: vec![],
        }
    }
}

/// Where an item's photo is.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedPhoto {
    /// A file (relative paths are taken from the feed's folder).
    Path(PathBuf),
    /// An http(s) URL, fetched by URL ingest's fetcher.
    Url(String),
    /// The photo's bytes, from a `data:` URL in the feed.
    Data(Bytes),
}

/// One feed item, read and checked: a product with its photos, or (`plan::by_photo`) one of its photos.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedItem {
    /// The feed's line (for CSV, the line its record starts on).
    pub line: usize,
    pub external_id: String,
    pub photos: Vec<FeedPhoto>,
    pub metadata: Value,
    pub captions: Vec<String>,
}

/// Where a feed comes from, as its messages name it and its paths are read.
pub struct FeedSource<'a> {
    /// Put before each bad line's number (`feed.csv:3: ...`); none: `line 3: ...`.
    pub name: Option<&'a str>,
    /// The folder relative photo paths are read from; none (a feed sent to the server): paths are refused.
    pub dir: Option<&'a Path>,
}

/// Lines that could not be read, kept to report together.
struct BadLines<'a> {
    source: &'a FeedSource<'a>,
    lines: Vec<String>,
    count: usize,
}

impl BadLines<'_> {
    const SHOWN: usize = 20;

    fn push(&mut self, line: usize, e: impl std::fmt::Display) {
        self.count += 1;
        if self.lines.len() < Self::SHOWN {
            self.lines.push(match self.source.name {
                Some(name) => format!("{name}:{line}: {e}"),
                None => format!("line {line}: {e}"),
            });
        }
    }

    fn into_result(self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let more = self.count.saturating_sub(Self::SHOWN);
        Err(ServiceError::Invalid(format!(
            "{}\n{} bad line(s){}: nothing was written; fix the feed and run again",
            self.lines.join("\n"),
            self.count,
            if more > 0 {
                format!(" ({more} not shown)")
            } else {
                String::new()
            }
        )))
    }
}

/// The whole feed, read and checked: every line an item, no id twice.
pub fn read_feed(
    bytes: &[u8],
    map: &FeedMapping,
    source: &FeedSource<'_>,
) -> Result<Vec<FeedItem>> {
    let mut bad = BadLines {
        source,
        lines: vec![],
        count: 0,
    };
    let items = match map.format {
        FeedFormat::Csv => read_csv(bytes, map, source, &mut bad)?,
        FeedFormat::Jsonl => read_jsonl(bytes, map, source, &mut bad),
    };
    let mut first_line: HashMap<&str, usize> = HashMap::new();
    for it in &items {
        if let Some(first) = first_line.insert(&it.external_id, it.line) {
            let id = &it.external_id;
            bad.push(
                it.line,
                format!("the id {id:?} again (first on line {first})"),
            );
        }
    }
    bad.into_result()?;
    Ok(items)
}

fn read_csv(
    bytes: &[u8],
    map: &FeedMapping,
    source: &FeedSource<'_>,
    bad: &mut BadLines<'_>,
) -> Result<Vec<FeedItem>> {
    let named = |what: String| match source.name {
        Some(name) => format!("{name}: {what}"),
        None => what,
    };
    let mut r = csv::Reader::from_reader(bytes);
    let header = r
        .headers()
        .map_err(|e| ServiceError::Invalid(named(format!("no header row ({e})"))))?
        .clone();
    for need in [&map.id_field, &map.image_field] {
        if !header.iter().any(|h| h == need) {
            return Err(ServiceError::Invalid(named(format!(
                "the header has no `{need}` column (it has {}); name the columns with --id-field and \
                 --image-field (id_field and image_field over HTTP)",
                header.iter().collect::<Vec<_>>().join(", ")
            ))));
        }
    }
    let mut items = vec![];
    for rec in r.records() {
        match rec {
            Ok(rec) => {
                let line = rec.position().map_or(0, |p| p.line() as usize);
                match csv_fields(map, &header, &rec).and_then(|f| item(map, source, line, f)) {
                    Ok(it) => items.push(it),
                    Err(e) => bad.push(line, e),
                }
            }
            // A record with another number of fields, or not UTF-8: the csv crate names its line.
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line() as usize);
                bad.push(line, e);
            }
        }
    }
    Ok(items)
}

fn read_jsonl(
    bytes: &[u8],
    map: &FeedMapping,
    source: &FeedSource<'_>,
    bad: &mut BadLines<'_>,
) -> Vec<FeedItem> {
    let mut items = vec![];
    for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let n = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let item = match std::str::from_utf8(raw) {
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => match serde_json::from_str::<Value>(l) {
                Ok(Value::Object(fields)) => item(map, source, n, fields),
                Ok(_) => Err("not a JSON object".to_string()),
                Err(e) => Err(format!("not JSON: {e}")),
            },
            Err(_) => Err("not UTF-8".to_string()),
        };
        match item {
            Ok(it) => items.push(it),
            Err(e) => bad.push(n, e),
        }
    }
    items
}

/// An item from its fields: the id, the photos and the captions taken out, every other field metadata.
fn item(
    map: &FeedMapping,
    source: &FeedSource<'_>,
    line: usize,
    mut fields: Map<String, Value>,
) -> std::result::Result<FeedItem, String> {
    let external_id = external_id(&map.id_field, fields.remove(&map.id_field))?;
    let places = match fields.remove(&map.image_field) {
        Some(v) => strings(&map.image_field, &v, "photos are paths or URLs")?.unwrap_or_default(),
        None => vec![],
    };
    let photos = places
        .iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| photo(source.dir, s.trim()))
        .collect::<std::result::Result<Vec<FeedPhoto>, String>>()?;
    if photos.is_empty() {
        return Err(format!(
            "no `{}` (the photo's path or http(s) URL, or a list of them; --image-field names another field)",
            map.image_field
        ));
    }
    let mut captions = match fields.remove(&map.captions_field) {
        None | Some(Value::Null) => vec![],
        Some(v) => match strings(&map.captions_field, &v, "captions are strings")? {
            Some(c) => c,
            None => {
                return Err(format!(
                    "`{}` is {v}: captions are an array of strings",
                    map.captions_field
                ));
            }
        },
    };
    for f in &map.caption_fields {
        match fields.get(f) {
            Some(Value::String(s)) if !s.trim().is_empty() => captions.push(s.clone()),
            _ => {}
        }
    }
    captions.retain(|c| !c.trim().is_empty());
    Ok(FeedItem {
        line,
        external_id,
        photos,
        metadata: Value::Object(fields),
        captions,
    })
}

/// The product's id: a string, or a number as its text (shops' ids often are numbers).
fn external_id(field: &str, v: Option<Value>) -> std::result::Result<String, String> {
    let id = match v {
        Some(Value::String(s)) if !s.trim().is_empty() => s,
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Null | Value::String(_)) | None => {
            return Err(format!(
                "no `{field}` (the product's id; --id-field names another field)"
            ));
        }
        Some(v) => return Err(format!("`{field}` is {v}: an id is a string or a number")),
    };
    if id.len() > 256 {
        return Err("the id is longer than 256 characters".into());
    }
    Ok(id)
}

/// A CSV record's fields. A CSV cell cannot tell empty from absent: an empty cell is left out. The captions
/// and the photos are lists separated by `|`.
fn csv_fields(
    map: &FeedMapping,
    header: &csv::StringRecord,
    record: &csv::StringRecord,
) -> std::result::Result<Map<String, Value>, String> {
    let mut fields = Map::new();
    for (name, cell) in header.iter().zip(record.iter()) {
        if cell.is_empty() {
            continue;
        }
        let v = if name == map.captions_field || name == map.image_field {
            Value::Array(
                cell.split('|')
                    .map(|c| Value::String(c.trim().to_string()))
                    .collect(),
            )
        } else if map.number_fields.iter().any(|n| n == name) {
            let n: serde_json::Number = cell
                .trim()
                .parse()
                .map_err(|_| format!("`{name}` is {cell:?}, not a number (--number-fields)"))?;
            Value::Number(n)
        } else {
            Value::String(cell.to_string())
        };
        fields.insert(name.to_string(), v);
    }
    Ok(fields)
}

/// A field that holds a string or a list of them (the photos, the captions), as its strings; None for any other
/// value. `items` says what the list holds, for the error naming an item that is not a string.
fn strings(
    field: &str,
    v: &Value,
    items: &str,
) -> std::result::Result<Option<Vec<String>>, String> {
    match v {
        Value::String(s) => Ok(Some(vec![s.clone()])),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!("`{field}` holds {other}: {items}")),
            })
            .collect::<std::result::Result<_, _>>()
            .map(Some),
        _ => Ok(None),
    }
}

/// A photo's place as the feed gives it.
fn photo(dir: Option<&Path>, s: &str) -> std::result::Result<FeedPhoto, String> {
    let lower = s.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(FeedPhoto::Url(s.to_string()))
    } else if lower.starts_with("data:") {
        let data = s.split_once(',').map(|(_, d)| d).unwrap_or("");
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(|b| FeedPhoto::Data(Bytes::from(b)))
            .map_err(|e| format!("a data: URL that is not valid base64 ({e})"))
    } else if s.contains("://") {
        Err(format!("{s:?} is neither a path nor an http(s) URL"))
    } else {
        match dir {
            Some(dir) => Ok(FeedPhoto::Path(dir.join(s))),
            None => Err(format!(
                "{s:?} is a file path; a feed sent to the server gives each photo as an http(s) URL \
                 (URL ingest on) or a data: URL"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mapping(numbers: &[&str], titles: &[&str]) -> FeedMapping {
        FeedMapping {
            caption_fields: titles.iter().map(|s| s.to_string()).collect(),
            number_fields: numbers.iter().map(|s| s.to_string()).collect(),
            ..FeedMapping::new(FeedFormat::Csv)
        }
    }

    fn fields(v: Value) -> Map<String, Value> {
        let Value::Object(f) = v else {
            panic!("an object")
        };
        f
    }

    fn files() -> FeedSource<'static> {
        FeedSource {
            name: Some("feed.csv"),
            dir: Some(Path::new("/feeds")),
        }
    }

    #[test]
    fn a_csv_record_and_a_json_line_map_to_the_same_item() {
        let m = mapping(&["price"], &["title"]);
        let header =
            csv::StringRecord::from(vec!["id", "title", "image", "price", "captions", "note"]);
        let rec = csv::StringRecord::from(vec![
            "sku-1",
            "Red shoe",
            "photos/1.jpg",
            "39.5",
            "a red shoe | on grass",
            "",
        ]);
        let from_csv = csv_fields(&m, &header, &rec)
            .and_then(|f| item(&m, &files(), 2, f))
            .expect("item");
        let line = json!({"id": "sku-1", "title": "Red shoe", "image": "photos/1.jpg", "price": 39.5,
                          "captions": ["a red shoe", "on grass"]});
        let from_json = item(&m, &files(), 2, fields(line)).expect("item");
        assert_eq!(from_csv, from_json);
        assert_eq!(
            from_csv.photos,
            vec![FeedPhoto::Path(Path::new("/feeds").join("photos/1.jpg"))]
        );
        assert_eq!(
            from_csv.metadata,
            json!({"title": "Red shoe", "price": 39.5})
        );
        assert_eq!(
            from_csv.captions,
            vec!["a red shoe", "on grass", "Red shoe"]
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let m = mapping(&[], &[]);
        let it = |v: Value| item(&m, &files(), 1, fields(v));
        assert!(
            it(json!({"image": "a.jpg"}))
                .unwrap_err()
                .contains("no `id`")
        );
        assert!(it(json!({"id": 7})).unwrap_err().contains("no `image`"));
        assert!(
            it(json!({"id": 7, "image": "ftp://x/a.jpg"}))
                .unwrap_err()
                .contains("neither a path nor an http(s) URL")
        );
        assert!(
            it(json!({"id": 7, "image": "a.jpg", "captions": [1]}))
                .unwrap_err()
                .contains("captions are strings")
        );
        let ok = it(json!({"id": 7, "image": "HTTPS://shop.example/a.jpg"})).expect("item");
        assert_eq!(ok.external_id, "7");
        assert_eq!(
            ok.photos,
            vec![FeedPhoto::Url("HTTPS://shop.example/a.jpg".into())]
        );
        let m = mapping(&["price"], &[]);
        let header = csv::StringRecord::from(vec!["id", "image", "price"]);
        let rec = csv::StringRecord::from(vec!["1", "a.jpg", "cheap"]);
        let e = csv_fields(&m, &header, &rec).expect_err("not a number");
        assert!(e.contains("`price` is \"cheap\", not a number"), "{e}");
    }

    #[test]
    fn a_feed_sent_to_the_server_gives_photos_by_url_or_data_never_by_path() {
        let sent = FeedSource {
            name: None,
            dir: None,
        };
        let m = FeedMapping::new(FeedFormat::Jsonl);
        let feed = [
            json!({"id": "a", "image": "data:image/png;base64,iVBORw0KGgo="}).to_string(),
            String::new(),
            json!({"id": "b", "image": "photos/b.jpg"}).to_string(),
            json!({"id": "c", "image": "data:image/png;base64,%%%"}).to_string(),
            "[1]\r".to_string(),
        ]
        .join("\n");
        let e = read_feed(feed.as_bytes(), &m, &sent).expect_err("bad lines");
        let e = e.to_string();
        for want in [
            "line 3: \"photos/b.jpg\" is a file path",
            "line 4: a data: URL that is not valid base64",
            "line 5: not a JSON object",
            "3 bad line(s): nothing was written",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        let ok = read_feed(feed.lines().next().expect("a line").as_bytes(), &m, &sent)
            .expect("a data: URL");
        assert_eq!(
            ok[0].photos,
            vec![FeedPhoto::Data(Bytes::from_static(b"\x89PNG\r\n\x1a\n"))]
        );
        assert_eq!(FeedFormat::sniff(b"  \n{\"id\": 1}"), FeedFormat::Jsonl);
        assert_eq!(FeedFormat::sniff(b"id,image\n"), FeedFormat::Csv);
    }
}
