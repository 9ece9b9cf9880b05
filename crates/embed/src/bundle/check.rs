//! The checks a bundle must pass to load: the manifest's internal agreement, every file's sha256, and the
//! names, dtypes and shapes of its tensors. Each failure names the file and what is wrong with it.

use std::{fs, path::Path};

use sha2::{Digest, Sha256};

use super::{
    Backbone, BundleError, FORMAT, FneSpec, FneStats, LabelTensors, LabelsSpec, Manifest,
    Similarity,
};
use crate::hubness::Hubness;

pub(super) struct Checker<'a> {
    pub dir: &'a Path,
}

impl Checker<'_> {
    pub(super) fn invalid(&self, file: &str, message: impl Into<String>) -> BundleError {
        BundleError::Invalid {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            message: message.into(),
        }
    }

    pub(super) fn manifest(&self, m: &Manifest) -> Result<(), BundleError> {
        let bad = |msg: String| Err(self.invalid("bundle.json", msg));
        if m.format != FORMAT {
            return Err(BundleError::Format {
                dir: self.dir.to_path_buf(),
                found: m.format,
            });
        }
        sizes(m).or_else(bad)?;
        hubness_settings(m).or_else(bad)?;
        labels_settings(m).or_else(bad)?;
        Ok(())
    }

    /// One backbone's FNE statistics: "mean" and "std" of `fne.dim` values each.
    pub(super) fn stats(&self, f: &FneSpec) -> Result<FneStats, BundleError> {
        let data = self.read(&f.stats)?;
        let st = self.safetensors(&f.stats, &data)?;
        Ok(FneStats {
            mean: self.tensor(&f.stats, &st, "mean", &[f.dim])?,
            std: self.tensor(&f.stats, &st, "std", &[f.dim])?,
        })
    }

    /// The labels' tensors, shaped by the manifest, every value finite.
    pub(super) fn labels(
        &self,
        l: &LabelsSpec,
        code_dim: usize,
        joint: usize,
    ) -> Result<LabelTensors, BundleError> {
        let file = l.weights.as_str();
        let data = self.read(file)?;
        let st = self.safetensors(file, &data)?;
        let head = code_dim - l.code_start;
        let t = LabelTensors {
            plus: self.tensor(file, &st, "plus", &[l.classes, head])?,
            minus: self.tensor(file, &st, "minus", &[l.classes, head])?,
            bias: self.tensor(file, &st, "bias", &[l.classes])?,
            vectors: self.tensor(file, &st, "vectors", &[l.classes, joint])?,
        };
        if [&t.plus, &t.minus, &t.bias, &t.vectors]
            .iter()
            .any(|v| v.iter().any(|x| !x.is_finite()))
        {
            return Err(self.invalid(file, "a tensor has a non-finite value"));
        }
        Ok(t)
    }

    pub(super) fn read(&self, file: &str) -> Result<Vec<u8>, BundleError> {
        fs::read(self.dir.join(file)).map_err(|e| self.unopened(file, e))
    }

    /// Missing, or there and unreadable (permissions, a folder in its place): the fixes differ.
    pub(super) fn unopened(&self, file: &str, e: std::io::Error) -> BundleError {
        if e.kind() == std::io::ErrorKind::NotFound {
            return self.missing(file);
        }
        BundleError::Unreadable {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            message: e.to_string(),
        }
    }

    pub(super) fn missing(&self, file: &str) -> BundleError {
        let hint = if file.ends_with(".onnx")
            || file.starts_with("tokenizer-")
            || file == "labels.safetensors"
        {
            " (graphs, tokenizers and labels that are not committed are built by scripts/setup-python.sh)"
        } else {
            ""
        };
        BundleError::Missing {
            dir: self.dir.to_path_buf(),
            file: file.to_string(),
            hint,
        }
    }

    pub(super) fn sha256(&self, file: &str, expected: &str) -> Result<(), BundleError> {
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

    pub(super) fn safetensors<'d>(
        &self,
        file: &str,
        data: &'d [u8],
    ) -> Result<safetensors::SafeTensors<'d>, BundleError> {
        safetensors::SafeTensors::deserialize(data)
            .map_err(|e| self.invalid(file, format!("not a safetensors file: {e}")))
    }

    /// A hubness bank: int8 "vectors" `[rows, joint]` and finite float32 "scales" `[rows]`.
    pub(super) fn bank(
        &self,
        file: &str,
        rows: usize,
        joint: usize,
        k: usize,
        alpha: f32,
    ) -> Result<Hubness, BundleError> {
        let data = self.read(file)?;
        let st = self.safetensors(file, &data)?;
        let vectors = self.int8_tensor(file, &st, "vectors", &[rows, joint])?;
        let scales = self.tensor(file, &st, "scales", &[rows])?;
        if scales.iter().any(|s| !s.is_finite()) {
            return Err(self.invalid(file, "tensor \"scales\" has a non-finite value"));
        }
        Ok(Hubness::from_int8(&vectors, &scales, joint, k, alpha))
    }

    /// The tensor `name` of `file`, or the error that it has none.
    fn named<'d>(
        &self,
        file: &str,
        st: &safetensors::SafeTensors<'d>,
        name: &str,
    ) -> Result<safetensors::tensor::TensorView<'d>, BundleError> {
        st.tensor(name)
            .map_err(|_| self.invalid(file, format!("has no tensor \"{name}\"")))
    }

    /// Reads an int8 tensor of exactly `shape`.
    pub(super) fn int8_tensor(
        &self,
        file: &str,
        st: &safetensors::SafeTensors<'_>,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<i8>, BundleError> {
        let t = self.named(file, st, name)?;
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
    pub(super) fn tensor(
        &self,
        file: &str,
        st: &safetensors::SafeTensors<'_>,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, BundleError> {
        use safetensors::Dtype;
        let t = self.named(file, st, name)?;
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

/// The sizes the sections must agree on, and the settings a bundle's similarity rules out.
fn sizes(m: &Manifest) -> Result<(), String> {
    for (i, b) in m.backbones().enumerate() {
        backbone_sizes(b, &section_prefix(i))?;
    }
    if m.projection.joint_dim == 0 || m.text.max_tokens == 0 {
        return Err("projection.joint_dim and text.max_tokens must be positive".into());
    }
    if m.similarity == Similarity::Euclidean && m.projection.abs {
        return Err("projection.abs is for order embeddings; a euclidean bundle's vectors are used as they are (set abs to false)".into());
    }
    Ok(())
}

/// Where backbone `i` (in code order) sits in bundle.json: "" for the first (`vision`, `fne`), else
/// "extra_backbones[i - 1].".
fn section_prefix(i: usize) -> String {
    match i {
        0 => String::new(),
        i => format!("extra_backbones[{}].", i - 1),
    }
}

/// One backbone's sizes: taps against raw_dim against fne.dim, its preparation, input size and thresholds
/// (`at`: where it sits in bundle.json, as `section_prefix` says).
fn backbone_sizes(b: Backbone<'_>, at: &str) -> Result<(), String> {
    let (v, f) = (b.vision, b.fne);
    let taps: usize = v.taps.iter().map(|t| t.channels).sum();
    if taps != v.raw_dim {
        return Err(format!(
            "{at}vision.taps sum to {taps} channels but {at}vision.raw_dim is {}",
            v.raw_dim
        ));
    }
    if f.dim != v.raw_dim {
        return Err(format!(
            "{at}fne.dim is {} but {at}vision.raw_dim is {}",
            f.dim, v.raw_dim
        ));
    }
    if let Some(p) = &v.prepare {
        if !(1..=16_384).contains(&p.width()) || !(1..=16_384).contains(&p.height()) {
            return Err(format!(
                "{at}vision.prepare.resize {:?} must be two sizes in 1..=16384",
                p.resize
            ));
        }
    }
    if v.input_size == 0 || v.input_size > v.resize {
        return Err(format!(
            "{at}vision.input_size {} must be in 1..=resize ({})",
            v.input_size, v.resize
        ));
    }
    let [lo, hi] = f.thresholds;
    if !matches!(
        lo.partial_cmp(&hi),
        Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
    ) {
        return Err(format!("{at}fne.thresholds [{lo}, {hi}] must be ordered"));
    }
    Ok(())
}

/// The hubness banks' settings (for cosine bundles only).
fn hubness_settings(m: &Manifest) -> Result<(), String> {
    if let Some(h) = &m.hubness {
        if m.similarity != Similarity::Cosine {
            return Err(format!(
                "hubness offsets cosine scores; this bundle's similarity is {}",
                serde_json::to_string(&m.similarity).unwrap_or_default()
            ));
        }
        bank_settings("hubness", "captions", h.captions, h.k, h.alpha)?;
        if let Some(a) = &h.annotation {
            bank_settings("hubness.annotation", "images", a.images, a.k, a.alpha)?;
        }
    }
    Ok(())
}

/// The labels' settings (for cosine bundles only; the gate reads the hubness bank).
fn labels_settings(m: &Manifest) -> Result<(), String> {
    if let Some(l) = &m.labels {
        if m.similarity != Similarity::Cosine || m.projection.abs {
            return Err("labels add unit vectors: they are for cosine bundles".into());
        }
        let code_dim = m.code_dim();
        if l.code_start >= code_dim {
            return Err(format!(
                "labels.code_start {} must be below the code's dimension ({code_dim}: every backbone's fne.dim)",
                l.code_start
            ));
        }
        if l.top == 0 || l.top > l.classes {
            return Err(format!(
                "labels.top {} must be in 1..=labels.classes ({})",
                l.top, l.classes
            ));
        }
        if !(l.weight.is_finite() && l.weight >= 0.0) {
            return Err(format!(
                "labels.weight {} must be a finite number >= 0",
                l.weight
            ));
        }
        if let Some(g) = &l.gate {
            if m.hubness.is_none() {
                return Err(
                    "labels.gate reads the hubness section's caption bank; this bundle has none"
                        .into(),
                );
            }
            if !(g.middle.is_finite() && g.slope.is_finite()) {
                return Err("labels.gate.middle and slope must be finite numbers".into());
            }
        }
    }
    Ok(())
}

/// A hubness bank's k and alpha against its row count (`section` names the manifest object, `rows` its count
/// field), in the words the manifest uses.
fn bank_settings(section: &str, rows: &str, n: usize, k: usize, alpha: f32) -> Result<(), String> {
    if k == 0 || k > n {
        return Err(format!(
            "{section}.k {k} must be in 1..={section}.{rows} ({n})"
        ));
    }
    if !(alpha.is_finite() && alpha >= 0.0) {
        return Err(format!(
            "{section}.alpha {alpha} must be a finite number >= 0"
        ));
    }
    Ok(())
}
