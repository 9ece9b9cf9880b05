//! The HTTP layer's metrics: requests by route and status, their latency, those in flight, and requests and
//! refusals by API key. Registered into the service's registry, so `/metrics` is one exposition.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
};

use crate::metrics::{Metrics, latency_family, registered};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    key: String,
    limit: String,
}

pub struct HttpMetrics {
    requests: Family<HttpLabels, Counter>,
    seconds: Family<HttpLabels, Histogram>,
    in_flight: Gauge,
    key_requests: Family<KeyLabels, Counter>,
    rate_limited: Family<LimitLabels, Counter>,
}

impl HttpMetrics {
    /// The families, registered into `metrics`' registry.
    pub fn register(metrics: &Metrics) -> HttpMetrics {
        metrics.register(|r| HttpMetrics {
            requests: registered(
                r,
                "http_requests",
                "HTTP requests by route and status",
                Family::default(),
            ),
            seconds: registered(
                r,
                "http_request_duration_seconds",
                "HTTP request latency",
                latency_family(),
            ),
            in_flight: registered(
                r,
                "http_requests_in_flight",
                "HTTP requests being served",
                Gauge::default(),
            ),
            key_requests: registered(
                r,
                "key_requests",
                "Requests by API key name (keys are never shown, only their names)",
                Family::default(),
            ),
            rate_limited: registered(
                r,
                "rate_limited",
                "Requests refused (429) by an API key's rate: limit=requests or rows",
                Family::default(),
            ),
        })
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, d: Duration) {
        let l = HttpLabels {
            method: method.to_string(),
            route: route.to_string(),
            status,
        };
        self.requests.get_or_create(&l).inc();
        self.seconds.get_or_create(&l).observe(d.as_secs_f64());
    }

    pub fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }

    pub fn key_request(&self, key: &str) {
        self.key_requests
            .get_or_create(&KeyLabels {
                key: key.to_string(),
            })
            .inc();
    }

    pub fn rate_limited(&self, key: &str, limit: &str) {
        self.rate_limited
            .get_or_create(&LimitLabels {
                key: key.to_string(),
                limit: limit.to_string(),
            })
            .inc();
    }
}
