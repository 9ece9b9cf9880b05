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
    for (i, bb) in m.backbones().enumerate() {
        let (v, f) = (bb.vision, bb.fne);
        println!(
            "vision {i}   {} {} from {}; {} taps, raw_dim {}, input {}x{} after resize {}, crop mode {:?}, {:?}",
            v.onnx,
            v.backbone,
            v.weights,
            v.taps.len(),
            v.raw_dim,
            v.input_size,
            v.input_size,
            v.resize,
            v.crop_mode,
            v.color_order
        );
        if let Some(p) = &v.prepare {
            println!(
                "prepare    every photo squashed to {}x{} ({:?}) first",
                p.width(),
                p.height(),
                p.filter
            );
        }
        println!(
            "fne {i}      {} dim {}, thresholds {:?}",
            f.stats, f.dim, f.thresholds
        );
    }
    println!(
        "code       {} features ({} backbone{}), vision id {}",
        m.code_dim(),
        1 + m.extra_backbones.len(),
        if m.extra_backbones.is_empty() {
            ""
        } else {
            "s"
        },
        b.vision_id
    );
    println!(
        "projection [{}, {}], abs {}, bias {}",
        m.projection.joint_dim,
        m.code_dim(),
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
