//! The shipped bundles load in the server (checksums, shapes, both graphs) and embed into unit vectors.
//! Skipped where the bundle or its vision graph (built by scripts/setup-python.sh) is absent.

use crate::common;

use jointspace::app::load_pipeline;
use jointspace::config::ServeArgs;
use jointspace_embed::bundle::PrepareFilter;
use jointspace_embed::decode;
use jointspace_embed::pipeline::{ImageEmbedding, ImageUse, Pipeline};
use jointspace_embed::prepare;

/// A shipped bundle's pipeline, or None (said on stderr) where its vision graph has not been built.
fn shipped(name: &str) -> Option<std::sync::Arc<jointspace_embed::pipeline::Pipeline>> {
    let dir = common::shipped_bundle(name)?;
    let cfg = ServeArgs::try_from_flags(["--bundle", dir.as_str()]).expect("flags");
    Some(load_pipeline(&cfg.model).unwrap_or_else(|e| panic!("{name} loads: {e:#}")))
}

/// A sentence's and a fixture photo's embeddings, each checked to be a unit vector of the joint dimension.
async fn sentence_and_photo(p: &Pipeline) -> (Vec<f32>, ImageEmbedding) {
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
    (v, img)
}

/// The default bundle (the server's `--bundle` default): VGG16 and EfficientNet-Lite2 in one FNE.
const DEFAULT: &str = "flickr8k-vgg16-effnetl2-fne";

#[tokio::test]
async fn default_bundle_loads_and_embeds() {
    let Some(p) = shipped(DEFAULT) else {
        return;
    };
    let defaults = ServeArgs::try_from_flags(std::iter::empty::<&str>()).expect("flags");
    if std::env::var_os("JOINTSPACE_BUNDLE").is_none() {
        assert!(defaults.model.bundle.ends_with(DEFAULT), "{defaults:?}");
    }
    // Two networks, each in its windowed form, their codes concatenated in the declared order; the second's
    // ImageNet head names objects.
    let m = &p.bundle.manifest;
    let nets: Vec<(&str, usize)> = m
        .backbones()
        .map(|b| (b.vision.backbone.as_str(), b.fne.dim))
        .collect();
    assert_eq!(nets, [("vgg16", 4224), ("efficientnet-lite2", 3768)]);
    assert!(m.labels.is_some(), "the default names objects");
    let (v, img) = sentence_and_photo(&p).await;
    assert_eq!(img.code.dim(), 4224 + 3768);
    assert_eq!(img.code.dim(), m.code_dim());
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
    // And the annotation side's bank of training images (annotation R@1 passes FNE-MH's 27.3 only with it): a
    // sentence sits near some training photos, so a stored caption's offset is negative too.
    let a = p
        .bundle
        .manifest
        .hubness
        .as_ref()
        .and_then(|h| h.annotation.as_ref())
        .expect("the default bundle carries its annotation bank");
    assert_eq!((a.images, a.k), (6000, 240));
    let (_, offsets) = p
        .caption_offsets(vec![v.clone()])
        .await
        .expect("caption offset");
    assert!(
        offsets[0] < 0.0 && offsets[0] > -a.alpha,
        "caption offset {} is not -alpha * (a mean cosine in (0, 1])",
        offsets[0]
    );
    // Trained on Flickr8k's 224-px squashes, it squashes every photo the same way first: a 640x480 photo
    // codes exactly as its own squash, uploaded as a PNG, does.
    let spec = p
        .bundle
        .manifest
        .vision
        .prepare
        .expect("the default records its preparation");
    assert_eq!(
        (spec.resize, spec.filter),
        ([224, 224], PrepareFilter::Bilinear)
    );
    let photo = common::fixture_image(7);
    let decoded = decode::decode(&photo, &decode::DecodeLimits::default()).expect("decodes");
    assert_eq!(decoded.dimensions(), (640, 480));
    let mut squashed = std::io::Cursor::new(Vec::new());
    prepare::apply(Some(&spec), decoded)
        .write_to(&mut squashed, image::ImageFormat::Png)
        .expect("png");
    let (big, small) = (
        p.embed_image(photo.into(), ImageUse::Query)
            .await
            .expect("photo"),
        p.embed_image(squashed.into_inner().into(), ImageUse::Query)
            .await
            .expect("squash"),
    );
    assert_eq!(big.code.packed(), small.code.packed());
    assert_eq!(
        (big.width, big.height),
        (640, 480),
        "the upload's own size is kept"
    );
}

/// The default reads every word its GloVe package knows: a shop's words that no Flickr8k caption
/// has are not unknown, only what GloVe lacks is; a caption of training words embeds exactly as through the
/// trained graph it extends, and a new word lands near its GloVe neighbours that the model was trained on.
#[tokio::test]
async fn the_default_reads_every_word_glove_knows() {
    let Some(p) = shipped(DEFAULT) else {
        return;
    };
    let vocabulary = p
        .bundle
        .manifest
        .text
        .vocabulary
        .as_ref()
        .expect("the default carries the whole GloVe vocabulary");
    assert!(vocabulary.words > 300_000, "{} words", vocabulary.words);
    let s = p
        .sentence("a trowel on a nightstand beside a succulent xqzt")
        .expect("tokenises");
    assert_eq!(s.unknown_words, ["xqzt"]);
    // Trained words keep their ids and rows: the same vector as the graph the vocabulary extends.
    // The same bundle with its text section pointed back at the trained graph: its files linked, not copied.
    let tmp = tempfile::tempdir().expect("temp dir");
    let trained = tmp.path().to_string_lossy().into_owned();
    for f in std::fs::read_dir(&p.bundle.dir)
        .expect("bundle dir")
        .flatten()
    {
        if f.file_name() != "bundle.json" {
            std::os::unix::fs::symlink(f.path(), tmp.path().join(f.file_name())).expect("link");
        }
    }
    let mut m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(p.bundle.dir.join("bundle.json")).expect("read"),
    )
    .expect("json");
    let text = m["text"].as_object_mut().expect("text");
    let from = text.remove("vocabulary").expect("vocabulary")["from"].clone();
    text.insert("onnx".into(), from["onnx"].clone());
    text.insert("tokenizer".into(), from["tokenizer"].clone());
    std::fs::write(format!("{trained}/bundle.json"), m.to_string()).expect("write");
    let cfg = ServeArgs::try_from_flags(["--bundle", trained.as_str()]).expect("flags");
    let base = load_pipeline(&cfg.model).expect("the trained-words form loads");
    let known = "a dog running on the beach";
    assert_eq!(
        p.embed_text(known).await.expect("text"),
        base.embed_text(known).await.expect("text")
    );
    assert_eq!(
        base.sentence("a trowel").expect("tokenises").unknown_words,
        ["trowel"]
    );
    // "puppies" is a training word, "puppy" too; "pup" is not: through GloVe it lands near them.
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let (pup, puppy, unk) = (
        p.embed_text("a pup").await.expect("text"),
        p.embed_text("a puppy").await.expect("text"),
        base.embed_text("a pup").await.expect("text"),
    );
    assert_eq!(
        base.sentence("a pup").expect("tokenises").unknown_words,
        ["pup"]
    );
    assert!(
        cos(&pup, &puppy) > cos(&unk, &puppy) + 0.1,
        "pup~puppy {} against <unk>~puppy {}",
        cos(&pup, &puppy),
        cos(&unk, &puppy)
    );
}

/// The normalized-CCA bundle (docs/results.md, "Closed-form systems"): TF-IDF over 3,000 words in its text graph,
/// an affine map of the FNE code, cosine. It loads, embeds unit vectors, and its text side ranks a paraphrase
/// above an unrelated sentence.
#[tokio::test]
async fn ncca_bundle_loads_and_embeds() {
    let Some(p) = shipped("flickr8k-vgg16-ncca") else {
        return;
    };
    assert_eq!(p.similarity(), jointspace_embed::bundle::Similarity::Cosine);
    assert!(p.bundle.projection_bias.is_some(), "an affine map");
    let mut texts = Vec::new();
    for s in [
        "a dog running on the beach",
        "two dogs run along the beach",
        "a man is playing a guitar on stage",
    ] {
        texts.push(p.embed_text(s).await.expect("text"));
    }
    let img = p
        .embed_image(common::fixture_image(0).into(), ImageUse::Store)
        .await
        .expect("image");
    for x in texts.iter().chain([&img.vector]) {
        assert_eq!(x.len(), p.joint_dim());
        let norm = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit vector, got norm {norm}");
    }
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let (near, far) = (cos(&texts[0], &texts[1]), cos(&texts[0], &texts[2]));
    assert!(near > far + 0.2, "paraphrase {near}, unrelated {far}");
}

/// The order bundle (docs/results.md, "Order embeddings end to end") loads as an order bundle without a bank
/// and embeds both sides into |unit vectors|. (Its retrieval figures are `jointspace eval`'s, key for key.)
#[tokio::test]
async fn order_bundle_loads_and_embeds() {
    let Some(p) = shipped("flickr8k-vgg16-order") else {
        return;
    };
    assert_eq!(p.similarity(), jointspace_embed::bundle::Similarity::Order);
    assert!(p.bundle.manifest.projection.abs && p.bundle.hubness.is_none());
    let (v, img) = sentence_and_photo(&p).await;
    for x in [&v, &img.vector] {
        assert!(x.iter().all(|a| *a >= 0.0), "|.| applied");
    }
}
