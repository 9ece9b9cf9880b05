//! The two kinds of stored item. Every layer below the API keys its data by it: the store's tables, the
//! index's scoring, the service's registry.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    Images,
    Captions,
}

impl Modality {
    pub const BOTH: [Modality; 2] = [Modality::Images, Modality::Captions];

    /// Also the name of the modality's table.
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Images => "images",
            Modality::Captions => "captions",
        }
    }
}
