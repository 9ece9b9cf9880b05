//! The service's one error type: what went wrong in the service's terms (not found, conflict, invalid,
//! unavailable, internal), with the model's errors kept whole for their detail (which item, which limit). The
//! store's and the index's errors are converted here, so nothing above the service sees either; the API maps
//! this type, and only this type, to HTTP (src/api/error.rs).

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
    Runtime(#[from] RuntimeError),
    /// No collection of this name (the API tells the caller how to create one).
    #[error("no collection named \"{0}\"")]
    NoCollection(String),
    /// The item asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The write would duplicate something that exists (a name, an external id).
    #[error("{0}")]
    Conflict(String),
    /// Well-formed but unacceptable input (422).
    #[error("{0}")]
    Invalid(String),
    /// Not ready to serve this yet, or the database cannot be reached (503).
    #[error("{0}")]
    Unavailable(String),
    /// A fault of this server or its database that no change to the request fixes (500).
    #[error("{0}")]
    Internal(String),
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoCollection(name) => ServiceError::NoCollection(name),
            StoreError::NotFound(m) => ServiceError::NotFound(m),
            StoreError::Conflict(m) => ServiceError::Conflict(m),
            StoreError::Invalid(m) => ServiceError::Invalid(m),
            e @ StoreError::Unavailable(_) => ServiceError::Unavailable(e.to_string()),
            e @ (StoreError::Db(_) | StoreError::Migrate(_) | StoreError::Tls(_)) => {
                ServiceError::Internal(e.to_string())
            }
        }
    }
}

impl From<IndexError> for ServiceError {
    fn from(e: IndexError) -> Self {
        ServiceError::Internal(e.to_string())
    }
}

fn at(index: Option<usize>) -> String {
    index.map(|i| format!("item {i}: ")).unwrap_or_default()
}

impl ServiceError {
    /// The write would duplicate something that exists (a name, an external id).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ServiceError::Conflict(_))
    }

    /// The item asked for does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ServiceError::NotFound(_) | ServiceError::NoCollection(_)
        )
    }

    /// Whether a photo of the request cannot be used (it does not decode, or is too large or too small), and
    /// which when the request had several: the other photos of a batch can go without it.
    pub fn bad_photo(&self) -> Option<Option<usize>> {
        match self {
            ServiceError::Decode { index, .. } => Some(*index),
            _ => None,
        }
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
