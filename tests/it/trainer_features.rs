//! Check of the image path on real photos against the trainer's raw-feature cache (JPEG decode, resize,
//! crops, normalisation, vision graph). It needs data that CI does not have, so it is `#[ignore]`d and
//! reported as such; run it with `cargo test --release --test it trainer_features:: -- --ignored` and:
//!   JOINTSPACE_PARITY_BUNDLE  a bundle whose vision.onnx and crop mode the cache was made with
//!   JOINTSPACE_FEATURES_DIR   the cache folder (features.npy, done.npy, names.json)
//!   JOINTSPACE_IMAGES_DIR     the photos (e.g. /work/shared/data/flickr8k/images)

use std::path::PathBuf;

use jointspace_embed::bundle::Bundle;
use jointspace_embed::crops;
use jointspace_embed::decode::{DecodeLimits, decode};
use jointspace_embed::prepare;
use jointspace_embed::runtime::{Backend, OrtBackend, RuntimeOptions, locate_dylib};

fn npy_rows(path: &PathBuf) -> (Vec<u8>, usize) {
    let raw = std::fs::read(path).expect("npy");
    assert_eq!(&raw[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([raw[8], raw[9]]) as usize;
    (raw, 10 + header_len)
}

#[test]
#[ignore = "needs the trainer's feature cache and the Flickr8k photos (see the module comment)"]
fn raw_features_match_the_trainer_cache_on_real_jpegs() {
    let var = |name: &str| {
        std::env::var_os(name)
            .unwrap_or_else(|| panic!("set {name} (see tests/trainer_features.rs)"))
    };
    let (bundle, cache, images) = (
        var("JOINTSPACE_PARITY_BUNDLE"),
        var("JOINTSPACE_FEATURES_DIR"),
        var("JOINTSPACE_IMAGES_DIR"),
    );
    let (cache, images) = (PathBuf::from(cache), PathBuf::from(images));
    let b = Bundle::load(std::path::Path::new(&bundle)).expect("bundle");
    let be = OrtBackend::new(
        &b,
        &locate_dylib(None).expect("onnxruntime"),
        RuntimeOptions::cpu(None),
    )
    .expect("runtime");
    let names: Vec<String> =
        serde_json::from_slice(&std::fs::read(cache.join("names.json")).expect("names"))
            .expect("json");
    let (done, dstart) = npy_rows(&cache.join("done.npy"));
    let (feats, fstart) = npy_rows(&cache.join("features.npy"));
    let dim = b.manifest.vision.raw_dim;
    let spec = &b.manifest.vision;
    let mut checked = 0;
    let mut worst = 0f32;
    for (i, name) in names.iter().enumerate() {
        if done[dstart + i] == 0 {
            continue;
        }
        let img = decode(
            &std::fs::read(images.join(name)).expect("image"),
            &DecodeLimits::default(),
        )
        .expect("decodes");
        let r = crops::resize(&prepare::apply(spec.prepare.as_ref(), img), spec.resize);
        let side = spec.graph_side();
        let n = crops::crop_origins(spec.crop_mode, spec.resize, side).len();
        let mut x = vec![0f32; n * crops::crop_len(spec)];
        crops::write_crops(&r, spec, spec.crop_mode, &mut x);
        let rows = be.vision(0, &x, n, side).expect("runs");
        // The trainer caches each photo's mean over its crops' (or windowed passes') rows.
        let got: Vec<f32> = (0..dim)
            .map(|j| (0..n).map(|k| rows[k * dim + j]).sum::<f32>() / n as f32)
            .collect();
        let row = &feats[fstart + i * dim * 4..fstart + (i + 1) * dim * 4];
        for (j, c) in row.chunks_exact(4).enumerate() {
            let want = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let rel = (got[j] - want).abs() / want.abs().max(1.0);
            worst = worst.max(rel);
        }
        checked += 1;
        if checked == 25 {
            break;
        }
    }
    eprintln!("{checked} photos, worst relative difference {worst:e}");
    assert!(checked > 0);
    assert!(
        worst < 1e-3,
        "raw features differ from the trainer's by up to {worst}"
    );
}
