//! Request bodies that may come as JSON or as multipart/form-data, read by one reader into the typed request each
//! route takes: a form's parts become the JSON object its fields spell (so a form sets exactly the options the
//! JSON body does), its file parts are kept as bytes beside it. The content type picks the parser; anything else
//! is a 415 that says what to send.

use axum::{
    extract::{FromRequest, Multipart, Request},
    http::header::CONTENT_TYPE,
};
use base64::Engine;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{
    error::{ApiError, BodyLimit, multipart_error},
    extract::ApiJson,
};

pub enum Body<J, F = J> {
    Json(J),
    /// A form's fields as the typed request `F`, and the bytes of its file parts in order.
    Form(F, Vec<Bytes>),
}

/// What a form field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A file: its bytes go beside the request, never through base64.
    File,
    /// A string.
    Text,
    /// JSON: a number, a boolean, an object or an array (`k`, `filter`, `metadata`, `items`).
    Json,
    /// A string that may repeat (`caption`): the request's field is the list of them.
    Texts,
}

/// A form field: the names a form may send it under (the first is the one error messages name), the typed
/// request's field it fills, and what it holds.
pub struct Field {
    pub names: &'static [&'static str],
    pub key: &'static str,
    pub kind: Kind,
}

pub const fn field(names: &'static [&'static str], key: &'static str, kind: Kind) -> Field {
    Field { names, key, kind }
}

/// The body as `J` (JSON) or as `F` and its files (a form whose fields are `form`).
pub async fn read<J: DeserializeOwned, F: DeserializeOwned>(
    req: Request,
    form: &[Field],
) -> Result<Body<J, F>, ApiError> {
    let ct = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ct.starts_with("application/json") {
        let ApiJson(v) = ApiJson::<J>::from_request(req, &()).await?;
        return Ok(Body::Json(v));
    }
    if !ct.starts_with("multipart/form-data") {
        return Err(ApiError::unsupported_media(format!(
            "content type \"{ct}\" is not accepted here: send application/json (images as base64) or multipart/form-data (image files)"
        )));
    }
    let limit = req.extensions().get::<BodyLimit>().copied();
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?;
    let (mut fields, mut files) = (Map::new(), Vec::new());
    loop {
        let part = match mp.next_field().await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => return Err(multipart_error(e, limit)),
        };
        let name = part.name().unwrap_or("").to_string();
        let Some(f) = form.iter().find(|f| f.names.contains(&name.as_str())) else {
            let expected: Vec<&str> = form.iter().map(|f| f.names[0]).collect();
            return Err(ApiError::bad_request(format!(
                "unknown form field \"{name}\"; expected {}",
                expected.join(", ")
            )));
        };
        let data = part.bytes().await.map_err(|e| multipart_error(e, limit))?;
        let text = || {
            std::str::from_utf8(&data).map(str::to_string).map_err(|_| {
                ApiError::bad_request(format!("form field \"{name}\" is not UTF-8 text"))
            })
        };
        match f.kind {
            Kind::File => files.push(data),
            Kind::Text => {
                fields.insert(f.key.into(), Value::String(text()?));
            }
            Kind::Json => {
                let v = serde_json::from_slice(&data).map_err(|e| {
                    ApiError::bad_request(format!("form field \"{name}\" is not valid JSON: {e}"))
                })?;
                fields.insert(f.key.into(), v);
            }
            Kind::Texts => {
                let list = fields.entry(f.key).or_insert_with(|| Value::Array(vec![]));
                if let Value::Array(l) = list {
                    l.push(Value::String(text()?));
                }
            }
        }
    }
    let typed = serde_json::from_value(Value::Object(fields))
        .map_err(|e| ApiError::bad_request(format!("the form's fields: {e}")))?;
    Ok(Body::Form(typed, files))
}

pub fn base64_image(field: &str, s: &str) -> Result<Bytes, ApiError> {
    let s = s.trim();
    // Accept data URLs as browsers produce them.
    let s = match s.strip_prefix("data:") {
        Some(rest) => rest.split_once(',').map(|(_, d)| d).unwrap_or(""),
        None => s,
    };
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map(Bytes::from)
        .map_err(|e| ApiError::bad_request(format!("{field} is not valid base64: {e}")))
}
