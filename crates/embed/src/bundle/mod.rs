//! The model bundle (docs/bundle.md): parse `bundle.json`, verify every file's sha256 and every tensor's
//! shape, and load the small tensors (FNE statistics, W). A bundle loads fully or not at all.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

mod check;
mod manifest;

use sha2::{Digest, Sha256};

use crate::{hubness::Hubness, modality::Modality};
use check::Checker;
pub use manifest::{
    AnnotationBankSpec, ColorOrder, CropMode, FneSpec, HubnessSpec, LabelGate, LabelsSpec,
    Manifest, Prepare, PrepareFilter, ProjectionSpec, Similarity, Tap, TextSpec, VisionSpec,
};

/// The only `format` this server reads.
pub const FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(
        "bundle {dir}: cannot read bundle.json ({reason}); give the bundle folder with --bundle or JOINTSPACE_BUNDLE"
    )]
    Manifest { dir: PathBuf, reason: String },
    #[error("bundle {dir}: bundle.json is not valid: {message}")]
    Parse { dir: PathBuf, message: String },
    #[error("bundle {dir}: bundle.json has format {found}, this server reads format {FORMAT} only")]
    Format { dir: PathBuf, found: u32 },
    #[error("bundle {dir}: {file} is missing{hint}")]
    Missing {
        dir: PathBuf,
        file: String,
        hint: &'static str,
    },
    #[error(
        "bundle {dir}: cannot read {file}: {message} (if the server runs as another user than the one that wrote the bundle, check the file's permissions)"
    )]
    Unreadable {
        dir: PathBuf,
        file: String,
        message: String,
    },
    #[error("bundle {dir}: {file} has sha256 {found} but bundle.json says {expected}")]
    Checksum {
        dir: PathBuf,
        file: String,
        expected: String,
        found: String,
    },
    #[error("bundle {dir}: {file}: {message}")]
    Invalid {
        dir: PathBuf,
        file: String,
        message: String,
    },
}

/// A verified bundle: the manifest plus the tensors the server keeps in memory. The ONNX graphs and the
/// tokenizer are opened by their own modules from the verified paths.
#[derive(Debug)]
pub struct Bundle {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// `name@<first 12 hex of sha256(bundle.json)>`: stored with every vector, so that vectors from two
    /// bundles are never mixed silently.
    pub id: String,
    /// Identifies everything up to the ternary code (graph, preprocessing, statistics, thresholds): two
    /// bundles with the same `vision_id` produce the same codes, so a new W can be applied to stored codes.
    pub vision_id: String,
    pub fne_mean: Vec<f32>,
    pub fne_std: Vec<f32>,
    /// W as stored, row-major `[joint_dim, fne_dim]`, converted to f32.
    pub projection: Vec<f32>,
    /// The affine maps' bias `[joint_dim]` (tensor "bias" beside W), added before any normalisation.
    pub projection_bias: Option<Vec<f32>>,
    /// Offsets of stored images for caption queries: a bank of training captions (shared with the labels'
    /// gate, which reads the same bank).
    pub hubness: Option<Arc<Hubness>>,
    /// Offsets of stored captions for image queries: a bank of training images (`hubness.annotation`).
    pub annotation_hubness: Option<Hubness>,
    /// The classifier read off the code and the classes' name vectors (`labels`).
    pub labels: Option<LabelTensors>,
}

/// Every file the manifest names has its sha256 in `files` (so every file read is checked).
fn check_files_listed(check: &Checker<'_>, manifest: &Manifest) -> Result<(), BundleError> {
    let (v, f, p, t) = (
        &manifest.vision,
        &manifest.fne,
        &manifest.projection,
        &manifest.text,
    );
    let banks = manifest
        .hubness
        .iter()
        .flat_map(|h| std::iter::once(&h.bank).chain(h.annotation.as_ref().map(|a| &a.bank)));
    let vocabulary = t
        .vocabulary
        .iter()
        .flat_map(|w| [&w.from.onnx, &w.from.tokenizer, &w.map]);
    for file in [&v.onnx, &f.stats, &p.weights, &t.onnx, &t.tokenizer]
        .into_iter()
        .chain(banks)
        .chain(vocabulary)
        .chain(
            manifest
                .labels
                .iter()
                .flat_map(|l| std::iter::once(&l.weights).chain(&l.from)),
        )
    {
        if !manifest.files.contains_key(file.as_str()) {
            return Err(check.invalid("bundle.json", format!("`files` has no sha256 for {file}")));
        }
    }
    Ok(())
}

/// W, and the bias beside it when there is one (finite throughout).
fn read_projection(
    check: &Checker<'_>,
    p: &ProjectionSpec,
    fne_dim: usize,
) -> Result<(Vec<f32>, Option<Vec<f32>>), BundleError> {
    let weights = check.read(&p.weights)?;
    let weights = check.safetensors(&p.weights, &weights)?;
    let projection = check.tensor(&p.weights, &weights, "weight", &[p.joint_dim, fne_dim])?;
    let projection_bias = if weights.names().contains(&"bias") {
        let b = check.tensor(&p.weights, &weights, "bias", &[p.joint_dim])?;
        if b.iter().any(|x| !x.is_finite()) {
            return Err(check.invalid(&p.weights, "tensor \"bias\" has a non-finite value"));
        }
        Some(b)
    } else {
        None
    };
    Ok((projection, projection_bias))
}

/// The hubness banks: of captions (offsets of images) and, when given, of images (offsets of captions).
fn read_banks(
    check: &Checker<'_>,
    manifest: &Manifest,
) -> Result<(Option<Arc<Hubness>>, Option<Hubness>), BundleError> {
    let p = &manifest.projection;
    let hubness = match &manifest.hubness {
        None => None,
        Some(h) => Some(Arc::new(check.bank(
            &h.bank,
            h.captions,
            p.joint_dim,
            h.k,
            h.alpha,
        )?)),
    };
    let annotation_hubness = match manifest
        .hubness
        .as_ref()
        .and_then(|h| h.annotation.as_ref())
    {
        None => None,
        Some(a) => Some(check.bank(&a.bank, a.images, p.joint_dim, a.k, a.alpha)?),
    };
    Ok((hubness, annotation_hubness))
}

/// `labels.safetensors`, as f32: row-major `[classes, head]` for plus and minus, `[classes, joint]` vectors.
#[derive(Debug)]
pub struct LabelTensors {
    pub plus: Vec<f32>,
    pub minus: Vec<f32>,
    pub bias: Vec<f32>,
    pub vectors: Vec<f32>,
}

impl Bundle {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The bank that gives stored points of `target` their search offsets, if the bundle has one.
    pub fn offsets_bank(&self, target: Modality) -> Option<&Hubness> {
        match target {
            Modality::Images => self.hubness.as_deref(),
            Modality::Captions => self.annotation_hubness.as_ref(),
        }
    }

    /// Reads and verifies a bundle directory.
    pub fn load(dir: &Path) -> Result<Bundle, BundleError> {
        let dir = dir.to_path_buf();
        let raw = fs::read(dir.join("bundle.json")).map_err(|e| BundleError::Manifest {
            dir: dir.clone(),
            reason: e.to_string(),
        })?;
        let manifest: Manifest = serde_json::from_slice(&raw).map_err(|e| BundleError::Parse {
            dir: dir.clone(),
            message: e.to_string(),
        })?;
        let check = Checker { dir: &dir };
        check.manifest(&manifest)?;
        // Checksums first: a shape check on a corrupt file would give a misleading message.
        for (file, expected) in &manifest.files {
            check.sha256(file, expected)?;
        }
        check_files_listed(&check, &manifest)?;
        let (f, p) = (&manifest.fne, &manifest.projection);
        let stats = check.read(&f.stats)?;
        let stats = check.safetensors(&f.stats, &stats)?;
        let fne_mean = check.tensor(&f.stats, &stats, "mean", &[f.dim])?;
        let fne_std = check.tensor(&f.stats, &stats, "std", &[f.dim])?;
        let (projection, projection_bias) = read_projection(&check, p, f.dim)?;
        let (hubness, annotation_hubness) = read_banks(&check, &manifest)?;
        let labels = match &manifest.labels {
            None => None,
            Some(l) => Some(check.labels(l, f.dim, p.joint_dim)?),
        };

        let id = format!(
            "{}@{}",
            manifest.name,
            &hex::encode(Sha256::digest(&raw))[..12]
        );
        let vision_id = vision_id(&manifest);
        Ok(Bundle {
            dir,
            manifest,
            id,
            vision_id,
            fne_mean,
            fne_std,
            projection,
            projection_bias,
            hubness,
            annotation_hubness,
            labels,
        })
    }
}

fn vision_id(m: &Manifest) -> String {
    let mut h = Sha256::new();
    let v = &m.vision;
    for part in [
        m.files.get(&v.onnx).map(String::as_str).unwrap_or(""),
        m.files.get(&m.fne.stats).map(String::as_str).unwrap_or(""),
        &serde_json::to_string(&(
            v.input_size,
            v.resize,
            v.crop_mode,
            v.color_order,
            v.mean,
            v.scale,
        ))
        .unwrap_or_default(),
        &serde_json::to_string(&(m.fne.thresholds, m.fne.std_eps)).unwrap_or_default(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    // Only when present, so that the codes of bundles without one keep their id.
    if let Some(p) = &v.prepare {
        h.update(serde_json::to_string(p).unwrap_or_default().as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())[..16].to_string()
}
