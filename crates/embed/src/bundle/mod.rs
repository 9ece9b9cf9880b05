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
    AnnotationBankSpec, Backbone, ColorOrder, CropMode, ExtraBackbone, FneSpec, HubnessSpec,
    LabelGate, LabelsSpec, Manifest, Prepare, PrepareFilter, ProjectionSpec, Similarity, Tap,
    TextSpec, VisionSpec,
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
    /// Each backbone's FNE statistics, in code order (`Manifest::backbones`).
    pub fne_stats: Vec<FneStats>,
    /// W as stored, row-major `[joint_dim, code_dim]`, converted to f32.
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

/// One backbone's training statistics (`fne.stats`): tensors "mean" and "std", `[fne.dim]`.
#[derive(Debug, Clone)]
pub struct FneStats {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

/// Every file the manifest names has its sha256 in `files` (so every file read is checked).
fn check_files_listed(check: &Checker<'_>, manifest: &Manifest) -> Result<(), BundleError> {
    let (p, t) = (&manifest.projection, &manifest.text);
    let backbones = manifest
        .backbones()
        .flat_map(|b| [&b.vision.onnx, &b.fne.stats]);
    let banks = manifest
        .hubness
        .iter()
        .flat_map(|h| std::iter::once(&h.bank).chain(h.annotation.as_ref().map(|a| &a.bank)));
    let vocabulary = t
        .vocabulary
        .iter()
        .flat_map(|w| [&w.from.onnx, &w.from.tokenizer, &w.map]);
    for file in backbones
        .chain([&p.weights, &t.onnx, &t.tokenizer])
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
    code_dim: usize,
) -> Result<(Vec<f32>, Option<Vec<f32>>), BundleError> {
    let weights = check.read(&p.weights)?;
    let weights = check.safetensors(&p.weights, &weights)?;
    let projection = check.tensor(&p.weights, &weights, "weight", &[p.joint_dim, code_dim])?;
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
        let (code_dim, p) = (manifest.code_dim(), &manifest.projection);
        let fne_stats = manifest
            .backbones()
            .map(|b| check.stats(b.fne))
            .collect::<Result<Vec<_>, _>>()?;
        let (projection, projection_bias) = read_projection(&check, p, code_dim)?;
        let (hubness, annotation_hubness) = read_banks(&check, &manifest)?;
        let labels = match &manifest.labels {
            None => None,
            Some(l) => Some(check.labels(l, code_dim, p.joint_dim)?),
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
            fne_stats,
            projection,
            projection_bias,
            hubness,
            annotation_hubness,
            labels,
        })
    }
}

/// A single-backbone bundle's id hashes its one backbone's parts; a bundle with extra backbones hashes every
/// backbone's, in code order (so the single-backbone id is as it always was).
fn vision_id(m: &Manifest) -> String {
    let mut h = Sha256::new();
    for b in m.backbones() {
        hash_backbone(&mut h, m, b);
    }
    hex::encode(h.finalize())[..16].to_string()
}

/// One backbone's part of the vision id: its graph's and statistics' checksums, geometry and thresholds.
fn hash_backbone(h: &mut Sha256, m: &Manifest, b: Backbone<'_>) {
    let (v, f) = (b.vision, b.fne);
    for part in [
        m.files.get(&v.onnx).map(String::as_str).unwrap_or(""),
        m.files.get(&f.stats).map(String::as_str).unwrap_or(""),
        &serde_json::to_string(&(
            v.input_size,
            v.resize,
            v.crop_mode,
            v.color_order,
            v.mean,
            v.scale,
        ))
        .unwrap_or_default(),
        &serde_json::to_string(&(f.thresholds, f.std_eps)).unwrap_or_default(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    // Only when present, so that the codes of bundles without one keep their id.
    if let Some(p) = &v.prepare {
        h.update(serde_json::to_string(p).unwrap_or_default().as_bytes());
        h.update([0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models")
            .join(name)
    }

    /// A copy of the two-backbone fixture with `edit` applied to its bundle.json (`files` re-summed for the
    /// files `replace` writes).
    fn variant(
        dir: &Path,
        replace: &[(&str, &[u8])],
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> PathBuf {
        for e in fs::read_dir(fixture("fixture-tiny-two")).expect("fixture") {
            let e = e.expect("entry");
            fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
        }
        let mut m: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join("bundle.json")).expect("read"))
                .expect("json");
        for (file, data) in replace {
            fs::write(dir.join(file), data).expect("write");
            m["files"][*file] = hex::encode(Sha256::digest(data)).into();
        }
        edit(&mut m);
        fs::write(
            dir.join("bundle.json"),
            serde_json::to_vec(&m).expect("json"),
        )
        .expect("write");
        dir.to_path_buf()
    }

    fn refusal(dir: &Path) -> String {
        Bundle::load(dir)
            .expect_err("the bundle must be refused")
            .to_string()
    }

    #[test]
    fn single_backbone_vision_ids_are_as_they_were() {
        // The ids these fixtures had before bundles could hold several backbones: stored codes key on them.
        for (name, id) in [
            ("fixture-tiny", "42833311e1815130"),
            ("fixture-tiny-windowed", "5c953fd496f345a4"),
            ("fixture-tiny-effnet", "ac990767bac2bb98"),
        ] {
            let b = Bundle::load(&fixture(name)).expect("loads");
            assert!(b.manifest.extra_backbones.is_empty());
            assert_eq!((b.vision_id.as_str(), b.fne_stats.len()), (id, 1), "{name}");
            assert_eq!(b.manifest.code_dim(), b.manifest.fne.dim);
        }
    }

    #[test]
    fn a_two_backbone_bundle_loads_every_backbone() {
        let b = Bundle::load(&fixture("fixture-tiny-two")).expect("loads");
        let m = &b.manifest;
        let dims: Vec<usize> = m.backbones().map(|bb| bb.fne.dim).collect();
        assert_eq!((dims, m.code_dim()), (vec![144, 248], 392));
        let stats: Vec<usize> = b.fne_stats.iter().map(|s| s.std.len()).collect();
        assert_eq!(stats, [144, 248]);
        assert_eq!(b.projection.len(), m.projection.joint_dim * 392);
        // Its vision id covers the second backbone: a change to it is another id.
        let mut other = m.clone();
        other.extra_backbones[0].fne.thresholds = [-0.3, 0.15];
        assert_ne!(vision_id(&other), b.vision_id);
        other.extra_backbones.clear();
        assert_ne!(vision_id(&other), b.vision_id);
    }

    #[test]
    fn a_bad_extra_backbone_is_refused_naming_its_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let at = |name: &str| {
            let d = tmp.path().join(name);
            fs::create_dir_all(&d).expect("dir");
            d
        };
        // Statistics of the first backbone's width (144) where the second's (248) are due.
        let first = fs::read(fixture("fixture-tiny-two").join("fne.safetensors")).expect("stats");
        let e = refusal(&variant(
            &at("stats"),
            &[("fne-effnet.safetensors", &first)],
            |_| {},
        ));
        assert!(
            e.contains("fne-effnet.safetensors") && e.contains("[248]"),
            "{e}"
        );
        // Its graph without a checksum in `files`.
        let e = refusal(&variant(&at("unlisted"), &[], |m| {
            m["files"]
                .as_object_mut()
                .expect("files")
                .remove("vision-effnet.onnx");
        }));
        assert!(
            e.contains("`files` has no sha256 for vision-effnet.onnx"),
            "{e}"
        );
        // Its graph changed under its checksum.
        let dir = variant(&at("sum"), &[], |_| {});
        fs::write(dir.join("vision-effnet.onnx"), b"not a graph").expect("write");
        let e = refusal(&dir);
        assert!(e.contains("vision-effnet.onnx has sha256"), "{e}");
        // Sizes that disagree, named by where they sit in bundle.json.
        let e = refusal(&variant(&at("dim"), &[], |m| {
            m["extra_backbones"][0]["fne"]["dim"] = 200.into();
        }));
        assert!(
            e.contains(
                "extra_backbones[0].fne.dim is 200 but extra_backbones[0].vision.raw_dim is 248"
            ),
            "{e}"
        );
        // W over the first backbone's code only.
        let e = refusal(&variant(&at("w"), &[], |m| {
            m["extra_backbones"] = serde_json::json!([]);
        }));
        assert!(
            e.contains("projection.safetensors") && e.contains("[16, 144]"),
            "{e}"
        );
    }
}
