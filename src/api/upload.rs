//! Request bodies that carry images: JSON with base64 or multipart/form-data. The content type picks the
//! parser; anything else is a 415 that says what to send.

use axum::{
    extract::{FromRequest, Multipart, Request},
    http::header::CONTENT_TYPE,
};
use base64::Engine;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::{
    error::{ApiError, BodyLimit, multipart_error},
    extract::ApiJson,
};

pub enum Body<T> {
    Json(T),
    /// Fields in order: (name, file name if a file part, bytes).
    Multipart(Vec<Part>),
}

pub struct Part {
    pub name: String,
    pub file_name: Option<String>,
    pub data: Bytes,
}

impl Part {
    pub fn text(&self) -> Result<&str, ApiError> {
        std::str::from_utf8(&self.data).map_err(|_| {
            ApiError::bad_request(format!("form field \"{}\" is not UTF-8 text", self.name))
        })
    }
}

pub async fn read<T: DeserializeOwned>(req: Request) -> Result<Body<T>, ApiError> {
    let ct = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ct.starts_with("application/json") {
        let ApiJson(v) = ApiJson::<T>::from_request(req, &()).await?;
        return Ok(Body::Json(v));
    }
    if ct.starts_with("multipart/form-data") {
        let limit = req.extensions().get::<BodyLimit>().copied();
        let mut mp = Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::new(e.status(), "bad_request", e.body_text()))?;
        let mut parts = Vec::new();
        loop {
            match mp.next_field().await {
                Ok(Some(f)) => {
                    let name = f.name().unwrap_or("").to_string();
                    let file_name = f.file_name().map(str::to_string);
                    let data = f.bytes().await.map_err(|e| multipart_error(e, limit))?;
                    parts.push(Part {
                        name,
                        file_name,
                        data,
                    });
                }
                Ok(None) => break,
                Err(e) => return Err(multipart_error(e, limit)),
            }
        }
        return Ok(Body::Multipart(parts));
    }
    Err(ApiError::unsupported_media(format!(
        "content type \"{ct}\" is not accepted here: send application/json (images as base64) or multipart/form-data (image files)"
    )))
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

pub fn json_field<T: DeserializeOwned>(p: &Part) -> Result<T, ApiError> {
    serde_json::from_slice(&p.data).map_err(|e| {
        ApiError::bad_request(format!("form field \"{}\" is not valid JSON: {e}", p.name))
    })
}
