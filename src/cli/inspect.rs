//! `jointspace bundle inspect`: what a bundle holds, checked (and its graphs opened, when asked).

use std::path::PathBuf;

use crate::{
    bundle::Bundle,
    config::RuntimeArgs,
    runtime::{self, Backend, OrtBackend},
};

pub fn inspect(dir: PathBuf, graphs: bool, rt: RuntimeArgs) -> anyhow::Result<()> {
    let b = Bundle::load(&dir)?;
    let m = &b.manifest;
    println!(
        "bundle     {} (format {}, created {})",
        b.id, m.format, m.created
    );
    println!(
        "vision     {} {} from {}; {} taps, raw_dim {}, input {}x{} after resize {}, crop mode {:?}, {:?}",
        m.vision.onnx,
        m.vision.backbone,
        m.vision.weights,
        m.vision.taps.len(),
        m.vision.raw_dim,
        m.vision.input_size,
        m.vision.input_size,
        m.vision.resize,
        m.vision.crop_mode,
        m.vision.color_order
    );
    if let Some(p) = &m.vision.prepare {
        println!(
            "prepare    every photo squashed to {}x{} ({:?}) first",
            p.width(),
            p.height(),
            p.filter
        );
    }
    println!(
        "fne        dim {}, thresholds {:?}, vision id {}",
        m.fne.dim, m.fne.thresholds, b.vision_id
    );
    println!(
        "projection [{}, {}], abs {}, bias {}",
        m.projection.joint_dim,
        m.fne.dim,
        m.projection.abs,
        if b.projection_bias.is_some() {
            "yes"
        } else {
            "no"
        }
    );
    println!(
        "text       {} + {}, max {} tokens",
        m.text.onnx, m.text.tokenizer, m.text.max_tokens
    );
    println!("similarity {:?}", m.similarity);
    println!("files      {} verified (sha256)", m.files.len());
    if let Some(t) = m.training.get("test_metrics") {
        println!("test       {t}");
    }
    if graphs {
        let dylib = runtime::locate_dylib(rt.ort_dylib.as_deref())?;
        let be = OrtBackend::new(&b, &dylib, rt.options())?;
        println!("graphs     open with {}", Backend::provider(&be).ort_name());
    }
    Ok(())
}
