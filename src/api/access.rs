//! The access policy of a route, as the middleware reads it: which key it needs, whether it runs a model, whether
//! it writes. A leaf of the API: the route table (`routes`) fills it, the key table (`keys`) and the middleware
//! read it, and it imports neither.

use std::{collections::HashMap, sync::Arc};

use axum::{
    extract::MatchedPath,
    http::{Method, Request},
};

/// Which key a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Probes, metrics and the API description: never behind a key (orchestrators and scrapers call them).
    Public,
    /// Any key: GET, search and embed.
    Read,
    /// A write or admin key: adding and deleting images and captions.
    Write,
    /// Only an admin key: collections themselves and server operations.
    Admin,
}

/// What the HTTP layer needs to know of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteInfo {
    pub access: Access,
    /// It runs a model (embed, search, adding images or captions): it may be refused with 429.
    pub infers: bool,
    /// It changes data: on a timeout it runs on to completion instead of being cancelled.
    pub writes: bool,
}

/// The kinds of route below, as one table: (access, infers, writes).
const fn route(access: Access, infers: bool, writes: bool) -> RouteInfo {
    RouteInfo {
        access,
        infers,
        writes,
    }
}

pub const PUBLIC: RouteInfo = route(Access::Public, false, false);
pub const READ: RouteInfo = route(Access::Read, false, false);
pub const READ_INFER: RouteInfo = route(Access::Read, true, false);
pub const ADMIN: RouteInfo = route(Access::Admin, false, true);
pub const WRITE: RouteInfo = route(Access::Write, false, true);
pub const WRITE_INFER: RouteInfo = route(Access::Write, true, true);

/// The table by (method, path template), for the middleware.
#[derive(Debug, Clone, Default)]
pub struct RouteInfos(Arc<HashMap<(Method, &'static str), RouteInfo>>);

impl RouteInfos {
    /// The routes as (method, path template, what it is).
    pub fn of(routes: impl IntoIterator<Item = (Method, &'static str, RouteInfo)>) -> RouteInfos {
        RouteInfos(Arc::new(
            routes.into_iter().map(|(m, p, i)| ((m, p), i)).collect(),
        ))
    }

    /// What a request's route is. A request that matches no route (404, 405) gets the cautious default:
    /// outside /v1/ public, GET and HEAD readable with the read key, anything else admin-only; and a CORS
    /// preflight is always public.
    pub fn of_request<B>(&self, req: &Request<B>) -> RouteInfo {
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        self.info(req.method(), matched, req.uri().path())
    }

    /// `of_request` from its parts: the method, the route template the router matched (if any), the path.
    pub fn info(&self, method: &Method, matched: Option<&str>, path: &str) -> RouteInfo {
        if method == Method::OPTIONS {
            return PUBLIC;
        }
        // HEAD is served by the GET handler.
        let lookup = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        let found = matched.and_then(|p| self.get(&lookup, p));
        found.unwrap_or_else(|| {
            if !path.starts_with("/v1/") {
                PUBLIC
            } else if matches!(*method, Method::GET | Method::HEAD) {
                READ
            } else {
                ADMIN
            }
        })
    }

    /// A route of the table by its OpenAPI method and path.
    pub fn get(&self, method: &Method, path: &str) -> Option<RouteInfo> {
        self.0.get(&(method.clone(), path)).copied()
    }
}
