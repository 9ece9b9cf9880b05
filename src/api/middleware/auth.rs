//! The key check: `Authorization: Bearer <key>` against the key table (`api::keys`). The route table says
//! what each route needs (`Access`); the key's role must allow it, a key limited to collections may only
//! touch those, and a key with a request rate is held to it (429 with Retry-After). The key found goes to the
//! handlers as a `Caller` (`api::extract`; listing collections shows only the key's; adding rows charges its row rate), and
//! its name, never its secret, to the request's log line and to `/metrics`. With no key configured the API
//! is open.

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::{
    api::{
        access::{Access, RouteInfos},
        error::ApiError,
        keys::{ApiKeys, KeyFound, check_secret},
        metrics::HttpMetrics,
    },
    config::HttpArgs,
};

fn key_from(
    value: &Option<String>,
    file: &Option<std::path::PathBuf>,
    what: &str,
) -> anyhow::Result<Option<String>> {
    use anyhow::Context;
    let key = match (value, file) {
        (Some(v), _) => v.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| f.display().to_string())
            .with_context(|| format!("cannot read the {what} key file"))?,
        (None, None) => return Ok(None),
    };
    check_secret(&key, what).map(Some)
}

impl ApiKeys {
    /// The environment's admin and read keys (or their files) and the keys file, if any.
    pub fn from_args(a: &HttpArgs) -> anyhow::Result<ApiKeys> {
        let admin = key_from(&a.admin_key, &a.admin_key_file, "admin")?;
        let read = key_from(&a.read_key, &a.read_key_file, "read")?;
        if admin.is_some() && admin == read {
            anyhow::bail!("the admin and read keys are the same; a read key must not grant writes");
        }
        ApiKeys::new(admin.as_deref(), read.as_deref(), a.keys_file.as_deref())
    }
}

pub(crate) fn too_many(name: &str, what: &str, wait: f64) -> ApiError {
    let secs = wait.ceil().clamp(1.0, 86_400.0) as u32;
    ApiError {
        retry_after: Some(secs),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("key \"{name}\" is over its rate of {what}; retry after {secs} s"),
        )
    }
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

fn forbidden(message: String) -> Response {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message).into_response()
}

/// The collection a request's path names (`/v1/collections/{collection}/...`), if any.
fn collection_of(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/collections/")
        .and_then(|rest| rest.split('/').next())
        .filter(|c| !c.is_empty())
}

/// The key check's state: the keys, the route table that says what each route needs, and the metrics.
#[derive(Clone)]
pub struct KeyCheck {
    pub keys: ApiKeys,
    pub routes: RouteInfos,
    pub metrics: Arc<HttpMetrics>,
}

pub async fn require_key(State(check): State<KeyCheck>, mut req: Request, next: Next) -> Response {
    let keys = &check.keys;
    let need = check.routes.of_request(&req).access;
    if keys.is_open() || need == Access::Public {
        req.extensions_mut().insert(KeyFound(None));
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, k)| k.trim())
        });
    let Some(presented) = presented else {
        return unauthorized("this API needs a key: send `Authorization: Bearer <key>`");
    };
    let Some(key) = keys.find(presented) else {
        return unauthorized("the API key is not valid");
    };
    tracing::Span::current().record("key", key.name.as_str());
    check.metrics.key_request(&key.name);
    if !key.role.allows(need) {
        let needs = if need == Access::Admin {
            "an admin key"
        } else {
            "a write or admin key"
        };
        return forbidden(format!(
            "the {} key \"{}\" cannot {} {}; it needs {needs}",
            key.role.as_str(),
            key.name,
            req.method(),
            req.uri().path()
        ));
    }
    if let Some(c) = collection_of(req.uri().path())
        && !key.may_touch(c)
    {
        return forbidden(format!(
            "key \"{}\" may not use collection \"{c}\" (its keys-file entry lists the collections it may)",
            key.name
        ));
    }
    if let Err(wait) = key.take_request(Instant::now()) {
        check.metrics.rate_limited(&key.name, "requests");
        return too_many(&key.name, "requests", wait).into_response();
    }
    req.extensions_mut().insert(KeyFound(Some(key)));
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collection_is_read_from_the_path() {
        assert_eq!(collection_of("/v1/collections/shop/images/3"), Some("shop"));
        assert_eq!(collection_of("/v1/collections/shop"), Some("shop"));
        assert_eq!(collection_of("/v1/collections"), None);
        assert_eq!(collection_of("/v1/collections/"), None);
        assert_eq!(collection_of("/v1/embed/text"), None);
    }
}
