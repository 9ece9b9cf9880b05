//! The integration tests: one binary (one link of ort, usearch and sqlx instead of one per file), one module
//! per area. Each starts the real application (ONNX Runtime, SQLite or a throwaway Postgres, HNSW) on the
//! fixture bundle, on port 0. Run one area with `cargo test --release --test it <module>::`.

mod common;

mod annotation;
mod api;
mod architecture;
mod bad_input;
mod bench_smoke;
mod cli;
mod concurrency;
mod container;
mod decode;
mod default_bundle;
mod device;
mod docs;
mod faults;
mod filters;
mod groups;
mod hybrid;
mod openapi;
mod ops;
mod parity;
mod pgvector;
mod postgres_tls;
mod readiness;
mod reindex;
mod replicas;
mod self_contained;
mod sharded;
mod similarity;
mod sync;
mod sync_api;
mod tenants;
mod thumbnails;
mod trainer_features;
mod transfer;
mod url_ingest;
mod writes;
