//! jointspace: photos and sentences in one space. The modules follow the data flow:
//! decode -> prepare -> crops -> vision -> fne -> projection, and tokenize -> text, composed by `pipeline`; then index
//! and store (the source of truth) behind `service`, and the api (and cli) on top. `runtime` is the
//! inference backend under vision and text; `batch` is their request batching; `hubness` the search offset
//! of a stored image; `thumbnail` its small JPEG for result grids; `modality` the two kinds of item every layer below the api keys by; `fetch` an image's bytes from a URL (URL ingest, behind an address guard). docs/architecture.md
//! draws it and states which layer may call which.

pub mod api;
pub mod app;
pub mod batch;
pub mod bundle;
pub mod cli;
pub mod config;
pub mod crops;
pub mod decode;
pub mod fetch;
pub mod filter;
pub mod fne;
pub mod hubness;
pub mod index;
pub mod metrics;
pub mod modality;
pub mod pipeline;
pub mod prepare;
pub mod projection;
pub mod runtime;
pub mod service;
pub mod store;
pub mod text;
pub mod thumbnail;
pub mod tokenize;
pub mod vision;
