//! The default bundle loads in the server (checksums, shapes, both graphs) and embeds into unit vectors.
//! Skipped where the bundle or its vision graph (built by scripts/setup-python.sh) is absent.

use crate::common;

use jointspace::{app::load_pipeline, config::ServeArgs, pipeline::ImageUse};

#[tokio::test]
async fn default_bundle_loads_and_embeds() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/models/flickr8k-vgg16-fne");
    if !std::path::Path::new(dir).join("vision.onnx").exists() {
        eprintln!("skipped: {dir}/vision.onnx is absent (scripts/setup-python.sh builds it)");
        return;
    }
    let cfg = ServeArgs::try_from_flags(["--bundle", dir]).expect("flags");
    let p = load_pipeline(&cfg.model).expect("the default bundle loads");
    let v = p
        .embed_text("a dog running on the beach")
        .await
        .expect("text");
    let img = p
        .embed_image(common::fixture_image(0).into(), ImageUse::Store)
        .await
        .expect("image");
    for x in [&v, &img.vector] {
        assert_eq!(x.len(), p.joint_dim());
        let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit vector, got norm {norm}");
    }
    assert_eq!(img.code.dim(), p.bundle.manifest.fne.dim);
    // The default ships the hubness bank (its search R@1 meets the bar only with it): a real image sits near
    // some of the bank's captions, so its offset, -alpha times a mean of positive cosines, is negative.
    assert!(
        p.bundle.hubness.is_some(),
        "the default bundle carries its hubness bank"
    );
    assert!(
        img.offset < 0.0 && img.offset > -1.0,
        "offset {} is not -alpha * (a mean cosine in (0, 1])",
        img.offset
    );
}
