//! The search page: `web/` compiled into the binary (no build step, no files to deploy). `/` is the page;
//! `/page/{file}` its script, style sheet and icon. Every answer carries a Content-Security-Policy that lets
//! the page load only its own files and talk only to this server, and an ETag so that a reload costs a 304.

use std::sync::LazyLock;

use axum::{
    extract::Path,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use sha2::{Digest, Sha256};

use super::error::{ApiError, ErrorBody};

/// Only this origin: scripts, styles, fetches. `blob:` images are object URLs the page itself makes (the
/// thumbnails it fetched with the API key, which an `<img src>` cannot send, and the preview of a dropped
/// photo). No inline script or style, no frames, no plugins, no forms posting elsewhere.
const CSP: &str = "default-src 'self'; img-src 'self' blob:; object-src 'none'; base-uri 'none'; \
                   frame-ancestors 'none'; form-action 'self'";

/// The page's files, by name: (content type, bytes).
const FILES: [(&str, &str, &[u8]); 4] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../../web/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../web/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../../web/app.css"),
    ),
    (
        "icon.svg",
        "image/svg+xml",
        include_bytes!("../../web/icon.svg"),
    ),
];

/// Each file's ETag (a digest of its bytes), computed once.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(_, _, bytes)| format!("\"{}\"", hex::encode(&Sha256::digest(bytes)[..8])))
        .collect()
});

fn serve(name: &str, headers: &HeaderMap) -> Option<Response> {
    let i = FILES.iter().position(|(n, _, _)| *n == name)?;
    let (_, content_type, bytes) = FILES[i];
    let etag = &ETAGS[i];
    let common = [
        (
            header::ETAG,
            HeaderValue::from_str(etag).unwrap_or(HeaderValue::from_static("\"0\"")),
        ),
        // Revalidate on every load (a 304 when unchanged), so a new binary's page is never mixed with an
        // old cached script.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let current = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().trim_start_matches("W/") == etag);
    if current {
        return Some((StatusCode::NOT_MODIFIED, common).into_response());
    }
    Some(
        (
            common,
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            bytes,
        )
            .into_response(),
    )
}

#[utoipa::path(get, path = "/", tag = "page", operation_id = "page",
    params(("If-None-Match" = Option<String>, Header, description = "an ETag from an earlier answer")),
    responses((status = 200, description = "the search page (HTML; its script and styles are under /page/)",
               body = String, content_type = "text/html"),
              (status = 304, description = "unchanged since the If-None-Match tag")))]
pub async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).unwrap_or_else(|| StatusCode::NOT_FOUND.into_response())
}

#[utoipa::path(get, path = "/page/{file}", tag = "page", operation_id = "page_file",
    params(("file" = String, Path, description = "app.js, app.css or icon.svg"),
           ("If-None-Match" = Option<String>, Header, description = "an ETag from an earlier answer")),
    responses((status = 200, description = "one of the page's files",
               content((String = "text/javascript"), (String = "text/css"), (String = "image/svg+xml"))),
              (status = 304, description = "unchanged since the If-None-Match tag"),
              (status = 404, description = "no such file", body = ErrorBody)))]
pub async fn file(Path(name): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    // index.html is served at / only, so the page has one address.
    (name != "index.html")
        .then(|| serve(&name, &headers))
        .flatten()
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no page file \"{name}\"; the page is at / and its files are app.js, app.css and icon.svg"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_files_that_are_served() {
        let html = std::str::from_utf8(FILES[0].2).expect("utf-8");
        for r in ["/page/app.js", "/page/app.css", "/page/icon.svg"] {
            assert!(html.contains(r), "index.html does not load {r}");
        }
        // CSP forbids inline code: the page must not have any.
        assert!(!html.contains("<script>") && !html.contains("style="));
        assert!(!html.contains(" onclick="));
    }

    #[test]
    fn an_etag_in_if_none_match_gives_304() {
        let first = serve("app.js", &HeaderMap::new()).expect("served");
        assert_eq!(first.status(), StatusCode::OK);
        let etag = first.headers()[header::ETAG].clone();
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, etag);
        assert_eq!(
            serve("app.js", &h).expect("served").status(),
            StatusCode::NOT_MODIFIED
        );
        assert!(serve("nothing.js", &h).is_none());
    }
}
