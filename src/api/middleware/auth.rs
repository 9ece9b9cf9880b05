//! The key check: `Authorization: Bearer <key>`. The admin key may do everything; the read key may only read
//! (GET, search, embed: `Access` in the route table). Keys are compared as SHA-256 digests in constant time, so neither a key's bytes nor
//! its length leak through response timing. With no key configured the API is open.

use std::path::Path;

use anyhow::Context;
use axum::{
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{
    api::{
        error::ApiError,
        routes::{Access, RouteInfos},
    },
    config::HttpArgs,
};

#[derive(Clone, Default)]
pub struct ApiKeys {
    admin: Option<[u8; 32]>,
    read: Option<[u8; 32]>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn key_from(
    value: &Option<String>,
    file: &Option<std::path::PathBuf>,
    what: &str,
) -> anyhow::Result<Option<String>> {
    let key = match (value, file) {
        (Some(v), _) => Some(v.trim().to_string()),
        (None, Some(f)) => {
            Some(read_key_file(f).with_context(|| format!("cannot read the {what} key file"))?)
        }
        (None, None) => None,
    };
    match key {
        Some(k) if k.is_empty() => {
            anyhow::bail!("the {what} key is empty; leave it unset to run without it")
        }
        Some(k) if k.len() < 16 => {
            anyhow::bail!("the {what} key is {} characters; use at least 16", k.len())
        }
        k => Ok(k),
    }
}

fn read_key_file(f: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(f)
        .with_context(|| f.display().to_string())?
        .trim()
        .to_string())
}

impl ApiKeys {
    pub fn new(admin: Option<&str>, read: Option<&str>) -> ApiKeys {
        ApiKeys {
            admin: admin.map(digest),
            read: read.map(digest),
        }
    }

    pub fn from_args(a: &HttpArgs) -> anyhow::Result<ApiKeys> {
        let admin = key_from(&a.admin_key, &a.admin_key_file, "admin")?;
        let read = key_from(&a.read_key, &a.read_key_file, "read")?;
        if admin.is_some() && admin == read {
            anyhow::bail!("the admin and read keys are the same; a read key must not grant writes");
        }
        if admin.is_none() && read.is_some() {
            // Without an admin key nobody could write; refusing is clearer than a server that cannot be fed.
            anyhow::bail!("a read key is set but no admin key: set JOINTSPACE_ADMIN_KEY too");
        }
        Ok(ApiKeys::new(admin.as_deref(), read.as_deref()))
    }

    pub fn is_open(&self) -> bool {
        self.admin.is_none() && self.read.is_none()
    }

    pub fn has_admin(&self) -> bool {
        self.admin.is_some()
    }

    pub fn has_read(&self) -> bool {
        self.read.is_some()
    }

    /// The access a presented key grants (both digests are always compared: no early exit).
    fn grant(&self, presented: &str) -> Option<Access> {
        let d = digest(presented);
        let eq =
            |k: &Option<[u8; 32]>| k.as_ref().map(|k| bool::from(k.ct_eq(&d))).unwrap_or(false);
        let (admin, read) = (eq(&self.admin), eq(&self.read));
        if admin {
            Some(Access::Admin)
        } else if read {
            Some(Access::Read)
        } else {
            None
        }
    }
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The key check's state: the keys, and the route table that says what each route needs.
#[derive(Clone)]
pub struct KeyCheck {
    pub keys: ApiKeys,
    pub routes: RouteInfos,
}

pub async fn require_key(State(check): State<KeyCheck>, req: Request, next: Next) -> Response {
    let keys = &check.keys;
    if keys.is_open() {
        return next.run(req).await;
    }
    let need = check.routes.of_request(&req).access;
    if need == Access::Public {
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
    match keys.grant(presented) {
        None => unauthorized("the API key is not valid"),
        Some(Access::Read) if need == Access::Admin => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "the read-only key cannot {} {}; use the admin key",
                req.method(),
                req.uri().path()
            ),
        )
        .into_response(),
        Some(_) => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_grant_their_own_access_only() {
        let k = ApiKeys::new(Some("admin-key-0123456789"), Some("read-key-0123456789"));
        assert_eq!(k.grant("admin-key-0123456789"), Some(Access::Admin));
        assert_eq!(k.grant("read-key-0123456789"), Some(Access::Read));
        assert_eq!(k.grant("admin-key-012345678"), None);
        assert_eq!(k.grant(""), None);
        assert!(ApiKeys::default().is_open());
    }
}
