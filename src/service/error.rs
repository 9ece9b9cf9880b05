//! The service's one error type: each lower layer's error, and the service's own refusals. The API maps it
//! to HTTP in src/api/error.rs.

use crate::{
    decode::DecodeError, fetch::FetchError, index::IndexError, pipeline::EmbedError,
    runtime::RuntimeError, store::StoreError, text::TextError,
};

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("{}{source}", at(*.index))]
    Decode {
        index: Option<usize>,
        source: DecodeError,
    },
    #[error("{}{source}", at(*.index))]
    Text {
        index: Option<usize>,
        source: TextError,
    },
    /// An image given by URL could not be fetched (boxed: the common results stay small).
    #[error("{}{}: {source}", at(*.index), crate::fetch::redacted(url))]
    Fetch {
        index: Option<usize>,
        url: String,
        source: Box<FetchError>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Index(#[from] IndexError),
    /// Well-formed but unacceptable input (422).
    #[error("{0}")]
    Invalid(String),
    /// Not ready to serve this yet (503).
    #[error("{0}")]
    Unavailable(String),
}

fn at(index: Option<usize>) -> String {
    index.map(|i| format!("item {i}: ")).unwrap_or_default()
}

impl ServiceError {
    /// The write would duplicate something that exists (a name, an external id).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ServiceError::Store(StoreError::Conflict(_)))
    }

    /// The item asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ServiceError::Store(StoreError::NotFound(_) | StoreError::NoCollection(_))
        )
    }

    /// A pipeline error, with the position of the failing item when the request had several.
    pub(super) fn embed(index: Option<usize>, e: EmbedError) -> ServiceError {
        match e {
            EmbedError::Decode(source) => ServiceError::Decode { index, source },
            EmbedError::Text(source) => ServiceError::Text { index, source },
            EmbedError::Runtime(e) => ServiceError::Runtime(e),
        }
    }
}

pub type Result<T, E = ServiceError> = std::result::Result<T, E>;
