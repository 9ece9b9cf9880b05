//! jointspace: photos and sentences in one space. The modules follow the data flow:
//! decode -> crops -> runtime (vision graph) -> fne -> projection, text -> index, with the store as the
//! source of truth and the api on top.

pub mod api;
pub mod app;
pub mod batch;
pub mod bundle;
pub mod cli;
pub mod config;
pub mod crops;
pub mod decode;
pub mod fne;
pub mod index;
pub mod metrics;
pub mod pipeline;
pub mod projection;
pub mod runtime;
pub mod service;
pub mod store;
pub mod text;
