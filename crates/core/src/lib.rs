//! What every layer of jointspace names: the two kinds of stored item (`modality`), how a query scores an item
//! (`similarity`), a metadata filter parsed once from the caller's JSON (`filter`), and a collection's searched
//! words (`text_field`).

pub mod filter;
pub mod modality;
pub mod similarity;
pub mod text_field;

pub use modality::Modality;
pub use similarity::Similarity;
pub use text_field::TextField;
