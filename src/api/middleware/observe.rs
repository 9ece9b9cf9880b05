//! Request metrics: in flight, count and latency by route template and status.

use std::time::Instant;

use axum::{
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};

use crate::api::AppState;

/// Counts and times every request by its route template (not the raw path: bounded label values).
pub async fn observe(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().to_string();
    let t = Instant::now();
    // A guard, so a panicking handler (caught further out) does not leave the gauge up.
    struct InFlight(prometheus_client::metrics::gauge::Gauge);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let g = InFlight(s.http.in_flight().clone());
    g.0.inc();
    let res = next.run(req).await;
    drop(g);
    s.http
        .observe(&method, &route, res.status().as_u16(), t.elapsed());
    res
}
