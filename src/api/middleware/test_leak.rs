//! A test hook, not a feature: a planted memory leak, so that the soak (scripts/soak.sh) can show that its memory
//! verdict fails on a real climb. With `JOINTSPACE_TEST_LEAK_BYTES_PER_REQUEST=N` (read once at start, logged as a
//! warning; absent or 0 in every real deployment) every request keeps N bytes, written so they are resident, in a
//! global for the life of the process.

use std::sync::Mutex;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::Response,
};

/// The environment variable that plants the leak (bytes kept per request; 0 or absent: none).
pub const ENV: &str = "JOINTSPACE_TEST_LEAK_BYTES_PER_REQUEST";

static KEPT: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());

/// The bytes per request that `ENV` asks to keep: 0 when it is absent or empty; an error when it is not a number.
pub fn from_env() -> anyhow::Result<usize> {
    match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{ENV}={v:?} is not a number of bytes")),
        _ => Ok(0),
    }
}

/// Keeps `bytes` bytes (non-zero, so the pages are touched and count in the resident set) for every request.
pub async fn leak(State(bytes): State<usize>, req: Request, next: Next) -> Response {
    let buf = vec![0xa5u8; bytes].into_boxed_slice();
    if let Ok(mut k) = KEPT.lock() {
        k.push(buf);
    }
    next.run(req).await
}
