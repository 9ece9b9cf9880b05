//! The model bundle (docs/bundle.md): parse `bundle.json`, verify every file's sha256 and every tensor's
//! shape, and load the small tensors (FNE statistics, W). A bundle loads fully or not at all.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::hubness::Hubness;

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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    pub created: String,
    pub files: BTreeMap<String, String>,
    pub vision: VisionSpec,
    pub fne: FneSpec,
    pub projection: ProjectionSpec,
    pub text: TextSpec,
    pub similarity: Similarity,
    #[serde(default)]
    pub training: serde_json::Value,
    /// The search-score offset per image (docs/bundle.md, "The hubness section").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hubness: Option<HubnessSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HubnessSpec {
    /// Tensors "vectors" int8 `[captions, joint_dim]` and "scales" float32 `[captions]`.
    pub bank: String,
    pub captions: usize,
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
}

impl CropMode {
    pub fn crops(self) -> usize {
        match self {
            CropMode::Center => 1,
            CropMode::Ten => 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ColorOrder {
    RGB,
    BGR,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Similarity {
    Cosine,
    Order,
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
    pub hubness: Option<Hubness>,
}

impl Bundle {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
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
        let (v, f, p, t) = (
            &manifest.vision,
            &manifest.fne,
            &manifest.projection,
            &manifest.text,
        );
        let bank = manifest.hubness.as_ref().map(|h| &h.bank);
        for file in [&v.onnx, &f.stats, &p.weights, &t.onnx, &t.tokenizer]
            .into_iter()
            .chain(bank)
        {
            if !manifest.files.contains_key(file.as_str()) {
                return Err(
                    check.invalid("bundle.json", format!("`files` has no sha256 for {file}"))
                );
            }
        }
        let stats = check.read(&f.stats)?;
        let stats = check.safetensors(&f.stats, &stats)?;
        let fne_mean = check.tensor(&f.stats, &stats, "mean", &[f.dim])?;
        let fne_std = check.tensor(&f.stats, &stats, "std", &[f.dim])?;
        let weights = check.read(&p.weights)?;
        let weights = check.safetensors(&p.weights, &weights)?;
        let projection = check.tensor(&p.weights, &weights, "weight", &[p.joint_dim, f.dim])?;
        let hubness = match &manifest.hubness {
            None => None,
            Some(h) => {
                let data = check.read(&h.bank)?;
                let st = check.safetensors(&h.bank, &data)?;
                let vectors =
                    check.int8_tensor(&h.bank, &st, "vectors", &[h.captions, p.joint_dim])?;
                let scales = check.tensor(&h.bank, &st, "scales", &[h.captions])?;
                if scales.iter().any(|s| !s.is_finite()) {
                    return Err(check.invalid(&h.bank, "tensor \"scales\" has a non-finite value"));
                }
                Some(Hubness::from_int8(
                    &vectors,
                    &scales,
                    p.joint_dim,
                    h.k,
                    h.alpha,
                ))
            }
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
            hubness,
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

struct Checker<'a> {
    dir: &'a Path,
}

impl Checker<'_> {
    fn invalid(&self, file: &str, message: impl Into<String>) -> BundleError {
        BundleError::Invalid {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            message: message.into(),
        }
    }

    fn manifest(&self, m: &Manifest) -> Result<(), BundleError> {
        let bad = |msg: String| Err(self.invalid("bundle.json", msg));
        if m.format != FORMAT {
            return Err(BundleError::Format {
                dir: self.dir.to_path_buf(),
                found: m.format,
            });
        }
        let v = &m.vision;
        let taps: usize = v.taps.iter().map(|t| t.channels).sum();
        if taps != v.raw_dim {
            return bad(format!(
                "vision.taps sum to {taps} channels but vision.raw_dim is {}",
                v.raw_dim
            ));
        }
        if m.fne.dim != v.raw_dim {
            return bad(format!(
                "fne.dim is {} but vision.raw_dim is {}",
                m.fne.dim, v.raw_dim
            ));
        }
        if let Some(p) = &v.prepare {
            if !(1..=16_384).contains(&p.width()) || !(1..=16_384).contains(&p.height()) {
                return bad(format!(
                    "vision.prepare.resize {:?} must be two sizes in 1..=16384",
                    p.resize
                ));
            }
        }
        if v.input_size == 0 || v.input_size > v.resize {
            return bad(format!(
                "vision.input_size {} must be in 1..=resize ({})",
                v.input_size, v.resize
            ));
        }
        let [lo, hi] = m.fne.thresholds;
        if !matches!(
            lo.partial_cmp(&hi),
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
        ) {
            return bad(format!("fne.thresholds [{lo}, {hi}] must be ordered"));
        }
        if m.projection.joint_dim == 0 || m.text.max_tokens == 0 {
            return bad("projection.joint_dim and text.max_tokens must be positive".into());
        }
        if let Some(h) = &m.hubness {
            if m.similarity != Similarity::Cosine {
                return bad(
                    "hubness offsets cosine scores; this bundle's similarity is order".into(),
                );
            }
            if h.k == 0 || h.k > h.captions {
                return bad(format!(
                    "hubness.k {} must be in 1..=hubness.captions ({})",
                    h.k, h.captions
                ));
            }
            if !(h.alpha.is_finite() && h.alpha >= 0.0) {
                return bad(format!(
                    "hubness.alpha {} must be a finite number >= 0",
                    h.alpha
                ));
            }
        }
        Ok(())
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, BundleError> {
        fs::read(self.dir.join(file)).map_err(|e| self.unopened(file, e))
    }

    /// Missing, or there and unreadable (permissions, a folder in its place): the fixes differ.
    fn unopened(&self, file: &str, e: std::io::Error) -> BundleError {
        if e.kind() == std::io::ErrorKind::NotFound {
            return self.missing(file);
        }
        BundleError::Unreadable {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            message: e.to_string(),
        }
    }

    fn missing(&self, file: &str) -> BundleError {
        let hint = if file.ends_with(".onnx") {
            " (a vision graph that is not committed is built by scripts/setup-python.sh)"
        } else {
            ""
        };
        BundleError::Missing {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            hint,
        }
    }

    fn sha256(&self, file: &str, expected: &str) -> Result<(), BundleError> {
        use std::io::Read;
        let mut f = fs::File::open(self.dir.join(file)).map_err(|e| self.unopened(file, e))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| self.invalid(file, e.to_string()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let found = hex::encode(h.finalize());
        if !found.eq_ignore_ascii_case(expected) {
            return Err(BundleError::Checksum {
                dir: self.dir.to_path_buf(),
                file: file.to_string(),
                expected: expected.to_string(),
                found,
            });
        }
        Ok(())
    }

    fn safetensors<'d>(
        &self,
        file: &str,
        data: &'d [u8],
    ) -> Result<safetensors::SafeTensors<'d>, BundleError> {
        safetensors::SafeTensors::deserialize(data)
            .map_err(|e| self.invalid(file, format!("not a safetensors file: {e}")))
    }

    /// Reads an int8 tensor of exactly `shape`.
    fn int8_tensor(
        &self,
        file: &str,
        st: &safetensors::SafeTensors<'_>,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<i8>, BundleError> {
        let t = st
            .tensor(name)
            .map_err(|_| self.invalid(file, format!("has no tensor \"{name}\"")))?;
        if t.dtype() != safetensors::Dtype::I8 || t.shape() != shape {
            return Err(self.invalid(
                file,
                format!(
                    "tensor \"{name}\" is {:?} {:?}; int8 {shape:?} expected",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        Ok(t.data().iter().map(|&b| b as i8).collect())
    }

    /// Reads a float16/float32 tensor of exactly `shape` as f32.
    fn tensor(
        &self,
        file: &str,
        st: &safetensors::SafeTensors<'_>,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, BundleError> {
        use safetensors::Dtype;
        let t = st
            .tensor(name)
            .map_err(|_| self.invalid(file, format!("has no tensor \"{name}\"")))?;
        if t.shape() != shape {
            return Err(self.invalid(
                file,
                format!(
                    "tensor \"{name}\" has shape {:?}, bundle.json implies {shape:?}",
                    t.shape()
                ),
            ));
        }
        let bytes = t.data();
        Ok(match t.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(self.invalid(
                    file,
                    format!("tensor \"{name}\" is {other:?}; float32 or float16 expected"),
                ));
            }
        })
    }
}
