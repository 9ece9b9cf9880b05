//! Extractors that parse a request's parts once, at the edge, and answer in the API's error shape: JSON
//! bodies, paths, queries, the collection name of `/collections/{collection}/...` routes, and the caller.

use std::{sync::Arc, time::Instant};

use axum::{
    Json,
    extract::{FromRequest, FromRequestParts, RawPathParams, Request},
    http::{StatusCode, request::Parts},
};
use serde::de::DeserializeOwned;

use super::metrics::HttpMetrics;
use super::{
    AppState,
    error::{ApiError, ApiResult, BodyLimit, body_too_large},
    keys::{Key, KeyFound},
    middleware::auth::too_many,
};
use crate::service::CollectionName;

/// The `{collection}` path segment, checked against the naming rule (422 when it breaks it).
pub struct CollectionPath(pub CollectionName);

impl<S: Send + Sync> FromRequestParts<S> for CollectionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        let name = params
            .iter()
            .find_map(|(k, v)| (k == "collection").then_some(v))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "this route has no {collection} segment",
                )
            })?;
        Ok(CollectionPath(CollectionName::parse(name)?))
    }
}

/// The `{collection}` and item segments of `/collections/{collection}/.../{item}` routes, parsed once: the item
/// as `T` (400 when it does not parse), then the name checked as `CollectionPath` checks it.
pub struct ItemPath<T>(pub CollectionName, pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ItemPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let ApiPath((name, item)) =
            ApiPath::<(String, T)>::from_request_parts(parts, state).await?;
        Ok(ItemPath(CollectionName::parse(&name)?, item))
    }
}

/// `Json` whose rejections use the error shape of `ApiError`.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = req.extensions().get::<BodyLimit>().copied();
        match Json::<T>::from_request(req, state).await {
            Ok(j) => Ok(ApiJson(j.0)),
            Err(r) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(body_too_large(limit)),
            Err(r) => Err(r.into()),
        }
    }
}

/// An axum extractor of `T` whose rejections use the error shape of `ApiError`.
macro_rules! api_extractor {
    ($(#[$doc:meta])* $name:ident wraps $inner:ty) => {
        $(#[$doc])*
        pub struct $name<T>(pub T);

        impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for $name<T> {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                Ok($name(<$inner>::from_request_parts(parts, state).await?.0))
            }
        }
    };
}

api_extractor!(
    /// `Path` whose rejections use the error shape of `ApiError`.
    ApiPath wraps axum::extract::Path<T>
);
api_extractor!(
    /// `Query` whose rejections use the error shape of `ApiError`.
    ApiQuery wraps axum::extract::Query<T>
);

/// The `offset` and `limit` of a list query, defaulted (0, 100) and checked.
pub fn page(offset: Option<i64>, limit: Option<i64>) -> ApiResult<(i64, i64)> {
    let (offset, limit) = (offset.unwrap_or(0), limit.unwrap_or(100));
    if offset < 0 || !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid(
            "offset must be >= 0 and limit between 1 and 1000",
        ));
    }
    Ok((offset, limit))
}

/// Who is calling: the key the key check found (none on an open API), with the metrics its refusals count in.
pub struct Caller {
    key: Option<Arc<Key>>,
    metrics: Arc<HttpMetrics>,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        s: &AppState,
    ) -> Result<Caller, Self::Rejection> {
        let KeyFound(key) = parts
            .extensions
            .get::<KeyFound>()
            .cloned()
            .unwrap_or_default();
        Ok(Caller {
            key,
            metrics: s.http.clone(),
        })
    }
}

impl Caller {
    /// Whether the caller may see and touch a collection.
    pub fn may_touch(&self, collection: &str) -> bool {
        self.key.as_ref().is_none_or(|k| k.may_touch(collection))
    }

    /// Charges `rows` inference rows (images or sentences to embed) to the key's row rate.
    pub fn charge_rows(&self, rows: usize) -> Result<(), ApiError> {
        let Some(k) = &self.key else { return Ok(()) };
        k.take_rows(rows, Instant::now()).map_err(|wait| {
            self.metrics.rate_limited(&k.name, "rows");
            if wait.is_infinite() {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    format!(
                        "key \"{}\" may embed at most {} rows at once and this request has {rows}: split it",
                        k.name,
                        k.rows_burst().unwrap_or_default()
                    ),
                )
            } else {
                too_many(&k.name, "rows (images and sentences embedded)", wait)
            }
        })
    }
}
