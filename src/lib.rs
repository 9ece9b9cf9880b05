//! jointspace, the server: the HTTP API (`api`), the command line (`cli`), their one configuration (`config`)
//! and `app`, which wires bundle -> runtime -> pipeline -> service -> router. Everything below lives in the
//! workspace's crates, one per layer: `jointspace-service` (the operations) over `jointspace-embed` (the model),
//! `jointspace-index` and `jointspace-store`, all naming `jointspace-core`'s types. This crate depends on the
//! service and, to load the model it hands the service, on embed; never on the store or the index.
//! docs/architecture.md draws it and states which layer may call which.

pub mod api;
pub mod app;
pub mod cli;
pub mod config;

// The layers below under the paths the modules use (`crate::service`, `crate::bundle`, ...).
use jointspace_core::{filter, modality};
pub use jointspace_embed::batch;
use jointspace_embed::{bundle, decode, pipeline, runtime, text, vision};
use jointspace_service as service;
use jointspace_service::{fetch, metrics};
