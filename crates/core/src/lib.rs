//! What every layer of jointspace names: the two kinds of stored item (`modality`), how a query scores an item
//! (`similarity`), and a metadata filter parsed once from the caller's JSON (`filter`).

pub mod filter;
pub mod modality;
pub mod similarity;

pub use modality::Modality;
pub use similarity::Similarity;
