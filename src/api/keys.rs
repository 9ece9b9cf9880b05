//! Who may call the API: named keys, each with a role, optionally limited to some collections and to a rate.
//! They come from a keys file (`--keys-file`, TOML) and from the two environment keys, which become the keys
//! named `admin` and `read`. Secrets are held only as SHA-256 digests and compared in constant time; a
//! key's name is what logs and metrics show.
//!
//! ```toml
//! [[key]]
//! name = "shop-a"
//! sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"  # or: key = "the secret"
//! role = "write"                       # admin | write | read
//! collections = ["shop-a"]             # optional: only these collections
//! requests_per_second = 20             # optional token bucket, with `burst` (default: one second's worth)
//! rows_per_second = 8                  # optional: images and sentences embedded, with `rows_burst`
//! ```

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::{Context, bail};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{access::Access, rate_limit::Bucket};

/// What a key may do. Admin: everything, collections and server operations included. Write: add and delete
/// images and captions (and read) in the collections it may touch. Read: GET, search and embed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Write,
    Admin,
}

impl Role {
    pub fn allows(self, need: Access) -> bool {
        match need {
            Access::Public => true,
            Access::Read => true,
            Access::Write => self >= Role::Write,
            Access::Admin => self == Role::Admin,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// Per-key rates (a token bucket each): requests, and inference rows (images and sentences embedded).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub requests: Option<(f64, f64)>,
    pub rows: Option<(f64, f64)>,
}

/// One key: its name, role, reach and limits. The secret is not kept, only its digest.
#[derive(Debug)]
pub struct Key {
    pub name: String,
    digest: [u8; 32],
    pub role: Role,
    /// None: every collection.
    pub collections: Option<HashSet<String>>,
    requests: Option<Mutex<Bucket>>,
    rows: Option<Mutex<Bucket>>,
}

impl Key {
    /// May this key touch the collection? (Listing shows only those it may.)
    pub fn may_touch(&self, collection: &str) -> bool {
        self.collections
            .as_ref()
            .is_none_or(|c| c.contains(collection))
    }

    /// Takes one request from the request bucket; Err(seconds to wait) when it is empty.
    pub fn take_request(&self, now: Instant) -> Result<(), f64> {
        match &self.requests {
            Some(b) => b.lock().unwrap_or_else(|p| p.into_inner()).take(1.0, now),
            None => Ok(()),
        }
    }

    /// Takes `n` inference rows; Err(seconds to wait), or Err(infinity) when `n` exceeds the burst itself.
    pub fn take_rows(&self, n: usize, now: Instant) -> Result<(), f64> {
        match &self.rows {
            Some(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(n as f64, now),
            None => Ok(()),
        }
    }

    pub fn rows_burst(&self) -> Option<f64> {
        self.rows
            .as_ref()
            .map(|b| b.lock().unwrap_or_else(|p| p.into_inner()).capacity())
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// What the key check found, put in the request for the handlers' `Caller`: the key, or None when the API is
/// open or the route public.
#[derive(Clone, Default)]
pub struct KeyFound(pub Option<Arc<Key>>);

/// Every key the server accepts. Empty: the API is open.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(Arc<Vec<Arc<Key>>>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    key: Vec<KeyEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    key: Option<String>,
    sha256: Option<String>,
    role: Role,
    collections: Option<Vec<String>>,
    requests_per_second: Option<f64>,
    burst: Option<f64>,
    rows_per_second: Option<f64>,
    rows_burst: Option<f64>,
}

/// A rate and its burst, both checked; the burst defaults to one second's worth (at least 1).
fn rate(
    name: &str,
    what: &str,
    per_s: Option<f64>,
    burst: Option<f64>,
) -> anyhow::Result<Option<(f64, f64)>> {
    match (per_s, burst) {
        (None, None) => Ok(None),
        (None, Some(_)) => bail!("key \"{name}\": a {what} burst needs a {what} rate too"),
        (Some(r), b) => {
            let b = b.unwrap_or(r.max(1.0));
            if !(r.is_finite() && r > 0.0 && b.is_finite() && b >= 1.0) {
                bail!("key \"{name}\": the {what} rate must be > 0 and its burst >= 1");
            }
            Ok(Some((r, b)))
        }
    }
}

/// A secret as given (env or file): trimmed, at least 16 characters.
pub fn check_secret(k: &str, what: &str) -> anyhow::Result<String> {
    let k = k.trim();
    if k.is_empty() {
        bail!("the {what} key is empty; leave it unset to run without it");
    }
    if k.len() < 16 {
        bail!("the {what} key is {} characters; use at least 16", k.len());
    }
    Ok(k.to_string())
}

impl ApiKeys {
    /// The two environment keys (`admin`, `read`) and the keys file's, checked together.
    pub fn new(
        admin: Option<&str>,
        read: Option<&str>,
        file: Option<&Path>,
    ) -> anyhow::Result<ApiKeys> {
        let mut keys: Vec<Key> = [("admin", admin, Role::Admin), ("read", read, Role::Read)]
            .into_iter()
            .filter_map(|(name, secret, role)| {
                secret.map(|s| Key::plain(name, digest(s), role, None, Limits::default()))
            })
            .collect();
        if let Some(f) = file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the keys file {}", f.display()))?;
            keys.extend(parse_file(&text).with_context(|| format!("keys file {}", f.display()))?);
        }
        let mut names = HashSet::new();
        let mut digests = HashSet::new();
        for k in &keys {
            if !names.insert(k.name.as_str()) {
                bail!(
                    "two keys are named \"{}\" (the environment's keys are named admin and read)",
                    k.name
                );
            }
            if !digests.insert(k.digest) {
                bail!("key \"{}\" has the same secret as another key", k.name);
            }
        }
        if !keys.is_empty() && !keys.iter().any(|k| k.role == Role::Admin) {
            // Nobody could create a collection: refusing is clearer than a server that cannot be fed.
            bail!(
                "keys are set but none is an admin key: set JOINTSPACE_ADMIN_KEY or give a key role = \"admin\""
            );
        }
        Ok(ApiKeys(Arc::new(keys.into_iter().map(Arc::new).collect())))
    }

    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key a presented secret is, comparing every digest (no early exit on a match).
    pub fn find(&self, presented: &str) -> Option<Arc<Key>> {
        let d = digest(presented);
        let mut found = None;
        for k in self.0.iter() {
            if bool::from(k.digest.ct_eq(&d)) {
                found = Some(k.clone());
            }
        }
        found
    }

    /// Roles present, for the start-up log.
    pub fn summary(&self) -> String {
        let mut by: HashMap<&str, usize> = HashMap::new();
        for k in self.0.iter() {
            *by.entry(k.role.as_str()).or_default() += 1;
        }
        let mut v: Vec<String> = by.into_iter().map(|(r, n)| format!("{n} {r}")).collect();
        v.sort();
        v.join(", ")
    }
}

impl Key {
    fn plain(
        name: &str,
        digest: [u8; 32],
        role: Role,
        collections: Option<HashSet<String>>,
        limits: Limits,
    ) -> Key {
        let bucket = |r: Option<(f64, f64)>| {
            r.map(|(rate, burst)| Mutex::new(Bucket::new(rate, burst, Instant::now())))
        };
        Key {
            name: name.to_string(),
            digest,
            role,
            collections,
            requests: bucket(limits.requests),
            rows: bucket(limits.rows),
        }
    }
}

fn parse_file(text: &str) -> anyhow::Result<Vec<Key>> {
    let file: KeysFile = toml::from_str(text).context("not a valid keys file")?;
    let mut out = vec![];
    for e in file.key {
        let name = e.name.trim();
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            bail!(
                "key name \"{}\": use 1-64 letters, digits, '_', '-' or '.' (it appears in logs and metrics)",
                e.name
            );
        }
        let digest = match (&e.key, &e.sha256) {
            (Some(k), None) => digest(&check_secret(k, &format!("\"{name}\""))?),
            (None, Some(h)) => {
                let bytes = hex::decode(h.trim())
                    .ok()
                    .filter(|b| b.len() == 32)
                    .with_context(|| {
                        format!(
                            "key \"{name}\": sha256 must be 64 hex digits (sha256sum of the secret)"
                        )
                    })?;
                let mut d = [0u8; 32];
                d.copy_from_slice(&bytes);
                d
            }
            _ => bail!(
                "key \"{name}\": give exactly one of `key` (the secret) and `sha256` (its digest)"
            ),
        };
        let collections = match e.collections {
            None => None,
            Some(_) if e.role == Role::Admin => bail!(
                "key \"{name}\": an admin key reaches every collection; to limit it to some, give it role = \"write\""
            ),
            Some(c) if c.is_empty() => {
                bail!("key \"{name}\": `collections` is empty; leave it out for all")
            }
            Some(c) => Some(c.into_iter().collect()),
        };
        let limits = Limits {
            requests: rate(name, "request", e.requests_per_second, e.burst)?,
            rows: rate(name, "rows", e.rows_per_second, e.rows_burst)?,
        };
        out.push(Key::plain(name, digest, e.role, collections, limits));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(file: &str) -> anyhow::Result<ApiKeys> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("keys.toml");
        std::fs::write(&p, file).expect("write");
        ApiKeys::new(
            Some("admin-key-0123456789"),
            Some("read-key-0123456789"),
            Some(&p),
        )
    }

    #[test]
    fn keys_from_env_and_file_are_found_by_their_secret_or_digest() {
        let k = keys(&format!(
            "[[key]]\nname = \"shop-a\"\nkey = \"shop-a-secret-0123\"\nrole = \"write\"\ncollections = [\"a\"]\n\n\
             [[key]]\nname = \"viewer\"\nsha256 = \"{}\"\nrole = \"read\"\n",
            hex::encode(digest("viewer-secret-0123"))
        ))
        .expect("valid");
        let name = |s: &str| k.find(s).map(|k| (k.name.clone(), k.role));
        for (secret, key, role) in [
            ("admin-key-0123456789", "admin", Role::Admin),
            ("read-key-0123456789", "read", Role::Read),
            ("shop-a-secret-0123", "shop-a", Role::Write),
            ("viewer-secret-0123", "viewer", Role::Read),
        ] {
            assert_eq!(name(secret), Some((key.into(), role)), "{secret}");
        }
        assert_eq!(name("viewer-secret-012"), None);
        let shop = k.find("shop-a-secret-0123").expect("shop");
        assert!(shop.may_touch("a") && !shop.may_touch("b"));
        assert!(Role::Write.allows(Access::Write) && !Role::Write.allows(Access::Admin));
        assert!(!Role::Read.allows(Access::Write) && Role::Admin.allows(Access::Admin));
        assert!(ApiKeys::default().is_open());
    }

    #[test]
    fn a_bad_keys_file_is_refused_with_the_reason() {
        for (file, says) in [
            (
                "[[key]]\nname = \"admin\"\nkey = \"another-secret-0123\"\nrole = \"read\"\n",
                "two keys are named",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"admin-key-0123456789\"\nrole = \"read\"\n",
                "same secret",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"short\"\nrole = \"read\"\n",
                "at least 16",
            ),
            (
                "[[key]]\nname = \"x\"\nsha256 = \"abc\"\nrole = \"read\"\n",
                "64 hex digits",
            ),
            ("[[key]]\nname = \"x\"\nrole = \"read\"\n", "exactly one of"),
            (
                "[[key]]\nname = \"x y\"\nkey = \"another-secret-0123\"\nrole = \"read\"\n",
                "key name",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"another-secret-0123\"\nrole = \"owner\"\n",
                "not a valid keys file",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"another-secret-0123\"\nrole = \"admin\"\ncollections = [\"a\"]\n",
                "role = \"write\"",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"another-secret-0123\"\nrole = \"read\"\nburst = 3\n",
                "needs a request rate",
            ),
            (
                "[[key]]\nname = \"x\"\nkey = \"another-secret-0123\"\nrole = \"read\"\nrows_per_second = 0\n",
                "must be > 0",
            ),
        ] {
            let e = format!("{:#}", keys(file).expect_err(file));
            assert!(e.contains(says), "{file}: {e}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("k.toml");
        std::fs::write(
            &p,
            "[[key]]\nname = \"x\"\nkey = \"another-secret-0123\"\nrole = \"read\"\n",
        )
        .expect("write");
        let e = ApiKeys::new(None, None, Some(&p)).expect_err("no admin");
        assert!(e.to_string().contains("none is an admin key"), "{e}");
    }
}
