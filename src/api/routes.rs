//! The one table of routes. Each row says what a route is (method, path, handler) and what the HTTP layer
//! must do around it: which key it needs, whether it runs a model (and so may answer 429), and whether it
//! writes (and so finishes past the request timeout). The router, the key check, the timeout rule and the
//! OpenAPI responses are all read from here, so a new route cannot be open to the wrong key by accident.

use axum::{
    Router,
    http::Method,
    routing::{MethodRouter, delete, get, patch, post, put},
};

use super::{
    AppState,
    access::{ADMIN, PUBLIC, READ, READ_INFER, RouteInfo, RouteInfos, WRITE, WRITE_INFER},
    captions, collections, embed, images, page, search, sync, system, upsert,
};

pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub info: RouteInfo,
    handler: MethodRouter<AppState>,
}

fn route(
    method: Method,
    path: &'static str,
    info: RouteInfo,
    handler: MethodRouter<AppState>,
) -> Route {
    Route {
        method,
        path,
        info,
        handler,
    }
}

/// Every route of the server.
pub fn table() -> Vec<Route> {
    use Method as M;
    vec![
        route(M::GET, "/", PUBLIC, get(page::index)),
        route(M::GET, "/page/{file}", PUBLIC, get(page::file)),
        route(M::GET, "/healthz", PUBLIC, get(system::healthz)),
        route(M::GET, "/readyz", PUBLIC, get(system::readyz)),
        route(M::GET, "/metrics", PUBLIC, get(system::metrics)),
        route(M::GET, "/openapi.yaml", PUBLIC, get(system::openapi)),
        route(M::POST, "/v1/collections", ADMIN, post(collections::create)),
        route(M::GET, "/v1/collections", READ, get(collections::list)),
        route(
            M::GET,
            "/v1/collections/{collection}",
            READ,
            get(collections::get),
        ),
        route(
            M::DELETE,
            "/v1/collections/{collection}",
            ADMIN,
            delete(collections::delete),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/export",
            READ,
            get(collections::export),
        ),
        route(
            M::POST,
            "/v1/collections/{collection}/sync",
            WRITE,
            post(sync::start),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/sync/{job}",
            READ,
            get(sync::get),
        ),
        route(
            M::POST,
            "/v1/collections/{collection}/images",
            WRITE_INFER,
            post(images::add),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/images",
            READ,
            get(images::list),
        ),
        route(
            M::POST,
            "/v1/collections/{collection}/images/search",
            READ_INFER,
            post(search::images),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/images/{id}",
            READ,
            get(images::get),
        ),
        route(
            M::DELETE,
            "/v1/collections/{collection}/images/{id}",
            WRITE,
            delete(images::delete),
        ),
        route(
            M::PATCH,
            "/v1/collections/{collection}/images/{id}",
            WRITE,
            patch(upsert::patch),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/images/by-external-id/{external_id}",
            READ,
            get(upsert::get),
        ),
        route(
            M::PUT,
            "/v1/collections/{collection}/images/by-external-id/{external_id}",
            WRITE_INFER,
            put(upsert::put),
        ),
        route(
            M::DELETE,
            "/v1/collections/{collection}/images/by-external-id/{external_id}",
            WRITE,
            delete(upsert::delete),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/images/{id}/thumbnail",
            READ,
            get(images::thumbnail),
        ),
        route(
            M::POST,
            "/v1/collections/{collection}/captions",
            WRITE_INFER,
            post(captions::add),
        ),
        route(
            M::GET,
            "/v1/collections/{collection}/captions",
            READ,
            get(captions::list),
        ),
        route(
            M::POST,
            "/v1/collections/{collection}/captions/search",
            READ_INFER,
            post(search::captions),
        ),
        route(
            M::DELETE,
            "/v1/collections/{collection}/captions/{id}",
            WRITE,
            delete(captions::delete),
        ),
        route(M::POST, "/v1/embed/text", READ_INFER, post(embed::text)),
        route(M::POST, "/v1/embed/image", READ_INFER, post(embed::image)),
        route(M::GET, "/v1/bundle", READ, get(system::bundle)),
        route(M::POST, "/v1/admin/reindex", ADMIN, post(system::reindex)),
        route(M::POST, "/v1/admin/snapshot", ADMIN, post(system::snapshot)),
    ]
}

/// The table's routes mounted on one router (same path, several methods: merged by axum).
pub fn router(table: Vec<Route>) -> Router<AppState> {
    table
        .into_iter()
        .fold(Router::new(), |r, route| r.route(route.path, route.handler))
}

/// The table as the middleware reads it.
pub fn infos(table: &[Route]) -> RouteInfos {
    RouteInfos::of(table.iter().map(|r| (r.method.clone(), r.path, r.info)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::http::Request;
    use utoipa::OpenApi;

    use super::*;
    use crate::api::{ApiDoc, access::Access};

    #[test]
    fn the_table_and_the_openapi_document_name_the_same_operations() {
        let table: BTreeSet<(String, String)> = table()
            .iter()
            .map(|r| (r.method.to_string(), r.path.to_string()))
            .collect();
        let doc = ApiDoc::openapi();
        let mut documented = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for (m, op) in [
                ("GET", &item.get),
                ("POST", &item.post),
                ("PUT", &item.put),
                ("PATCH", &item.patch),
                ("DELETE", &item.delete),
            ] {
                if op.is_some() {
                    documented.insert((m.to_string(), path.clone()));
                }
            }
        }
        assert_eq!(table, documented);
    }

    #[test]
    fn unmatched_requests_get_the_cautious_default() {
        let infos = infos(&table());
        let req = |m: Method, p: &str| {
            Request::builder()
                .method(m)
                .uri(p)
                .body(())
                .expect("request")
        };
        // No MatchedPath: a POST under /v1/ that no route serves (say a future /v1/embed/... path) is
        // admin-only, not readable by the read key because of how its path looks.
        let access = |m: Method, p: &str| infos.of_request(&req(m, p)).access;
        assert_eq!(access(Method::POST, "/v1/embed/new"), Access::Admin);
        assert_eq!(access(Method::GET, "/v1/nothing"), Access::Read);
        assert_eq!(access(Method::HEAD, "/v1/nothing"), Access::Read);
        assert_eq!(access(Method::GET, "/nothing"), Access::Public);
        assert_eq!(access(Method::OPTIONS, "/v1/collections"), Access::Public);
    }

    #[test]
    fn matched_requests_get_their_rows() {
        let infos = infos(&table());
        let with = |m: Method, template: &str| infos.info(&m, Some(template), "/v1/x");
        let search = with(Method::POST, "/v1/collections/{collection}/images/search");
        assert_eq!(search, READ_INFER);
        assert_eq!(
            with(Method::POST, "/v1/collections/{collection}/images"),
            WRITE_INFER
        );
        assert_eq!(with(Method::HEAD, "/v1/collections/{collection}"), READ);
        assert_eq!(with(Method::DELETE, "/v1/collections/{collection}"), ADMIN);
        assert_eq!(
            with(Method::DELETE, "/v1/collections/{collection}/images/{id}"),
            WRITE
        );
        assert_eq!(with(Method::POST, "/v1/admin/reindex"), ADMIN);
        assert_eq!(
            infos.info(&Method::GET, Some("/metrics"), "/metrics"),
            PUBLIC
        );
        assert_eq!(
            with(Method::PATCH, "/v1/collections/{collection}/images/{id}"),
            WRITE
        );
        assert_eq!(
            with(
                Method::PUT,
                "/v1/collections/{collection}/images/by-external-id/{external_id}"
            ),
            WRITE_INFER
        );
        // A matched path with a method it does not serve (405) falls back to the default.
        assert_eq!(with(Method::PUT, "/v1/collections"), ADMIN);
    }

    #[test]
    fn routes_are_classified_by_method_and_path() {
        let infos = infos(&table());
        let cases = [
            (Method::GET, "/healthz", Access::Public),
            (Method::GET, "/metrics", Access::Public),
            (Method::GET, "/", Access::Public),
            (Method::GET, "/page/{file}", Access::Public),
            (Method::POST, "/v1/collections", Access::Admin),
            (Method::GET, "/v1/collections", Access::Read),
            (
                Method::DELETE,
                "/v1/collections/{collection}",
                Access::Admin,
            ),
            (
                Method::POST,
                "/v1/collections/{collection}/images",
                Access::Write,
            ),
            (
                Method::POST,
                "/v1/collections/{collection}/images/search",
                Access::Read,
            ),
            (
                Method::POST,
                "/v1/collections/{collection}/captions/search",
                Access::Read,
            ),
            (Method::POST, "/v1/embed/text", Access::Read),
            (Method::POST, "/v1/admin/reindex", Access::Admin),
            (
                Method::GET,
                "/v1/collections/{collection}/images/{id}/thumbnail",
                Access::Read,
            ),
            (Method::OPTIONS, "/v1/collections", Access::Public),
        ];
        for (m, p, want) in cases {
            assert_eq!(infos.info(&m, Some(p), p).access, want, "{m} {p}");
        }
    }
}
