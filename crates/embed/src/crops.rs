//! Step 2: resize to `resize x resize` with the exact float32 triangle filter of docs/bundle.md, then cut
//! the crops straight into the runtime's NCHW batch buffer (normalised, in the graph's colour order).

use image::RgbImage;

use crate::bundle::{ColorOrder, CropMode, VisionSpec};

/// One axis of the separable filter: for every output position, the first input index and its weights.
struct AxisWeights {
    taps: Vec<(usize, Vec<f32>)>,
}

impl AxisWeights {
    /// Computed in f64 and normalised before rounding to f32, as the trainer's reference does.
    fn new(n: usize, m: usize) -> AxisWeights {
        let scale = n as f64 / m as f64;
        let support = scale.max(1.0);
        let taps = (0..m)
            .map(|i| {
                let c = (i as f64 + 0.5) * scale;
                let lo = ((c - support).floor() as isize).max(0) as usize;
                let hi = ((c + support).ceil() as isize).min(n as isize).max(0) as usize;
                let w: Vec<f64> = (lo..hi)
                    .map(|j| (1.0 - ((j as f64 + 0.5 - c) / support).abs()).max(0.0))
                    .collect();
                let sum: f64 = w.iter().sum();
                (
                    lo,
                    w.iter()
                        .map(|x| if sum > 0.0 { (x / sum) as f32 } else { 0.0 })
                        .collect(),
                )
            })
            .collect();
        AxisWeights { taps }
    }
}

/// A float32 HWC image, values in 0..255, not rounded.
pub struct Resized {
    pub side: usize,
    pub data: Vec<f32>,
}

/// Resizes to `side x side`: rows first (the vertical pass, over the height), then columns.
pub fn resize(img: &RgbImage, side: usize) -> Resized {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let src = img.as_raw();
    let wy = AxisWeights::new(h, side);
    let wx = AxisWeights::new(w, side);
    // Rows: [side][w][3]
    let stride = w * 3;
    let mut tmp = vec![0f32; side * stride];
    for (y, (lo, ws)) in wy.taps.iter().enumerate() {
        let out = &mut tmp[y * stride..(y + 1) * stride];
        for (k, &wt) in ws.iter().enumerate() {
            let row = &src[(lo + k) * stride..(lo + k + 1) * stride];
            for (o, &v) in out.iter_mut().zip(row) {
                *o += wt * v as f32;
            }
        }
    }
    // Columns: [side][side][3]
    let mut data = vec![0f32; side * side * 3];
    for y in 0..side {
        let row = &tmp[y * stride..(y + 1) * stride];
        let out = &mut data[y * side * 3..(y + 1) * side * 3];
        for (x, (lo, ws)) in wx.taps.iter().enumerate() {
            let mut acc = [0f32; 3];
            for (k, &wt) in ws.iter().enumerate() {
                let p = &row[(lo + k) * 3..(lo + k) * 3 + 3];
                acc[0] += wt * p[0];
                acc[1] += wt * p[1];
                acc[2] += wt * p[2];
            }
            out[x * 3..x * 3 + 3].copy_from_slice(&acc);
        }
    }
    Resized { side, data }
}

/// Crop origins `(top, left, mirrored)` in the order of docs/bundle.md (`windowed`: the whole image, then
/// its mirror).
pub fn crop_origins(mode: CropMode, resize: usize, input: usize) -> Vec<(usize, usize, bool)> {
    let (e, c) = (resize - input, (resize - input) / 2);
    match mode {
        CropMode::Center => vec![(c, c, false)],
        CropMode::Windowed => vec![(0, 0, false), (0, 0, true)],
        CropMode::Ten => {
            let five = [(0, 0), (0, e), (e, 0), (e, e), (c, c)];
            five.iter()
                .map(|&(t, l)| (t, l, false))
                .chain(five.iter().map(|&(t, l)| (t, l, true)))
                .collect()
        }
    }
}

/// Floats one crop occupies in the NCHW buffer.
pub fn crop_len(spec: &VisionSpec) -> usize {
    3 * spec.graph_side() * spec.graph_side()
}

/// Writes this image's crops, normalised, into `out` (exactly `crops * crop_len` floats).
pub fn write_crops(img: &Resized, spec: &VisionSpec, mode: CropMode, out: &mut [f32]) {
    let s = spec.graph_side();
    let plane = s * s;
    let channels: [usize; 3] = match spec.color_order {
        ColorOrder::RGB => [0, 1, 2],
        ColorOrder::BGR => [2, 1, 0],
    };
    for (n, (top, left, mirror)) in crop_origins(mode, img.side, s).into_iter().enumerate() {
        let crop = &mut out[n * 3 * plane..(n + 1) * 3 * plane];
        for (c, &src_c) in channels.iter().enumerate() {
            let (mean, scale) = (spec.mean[c], spec.scale[c]);
            let dst = &mut crop[c * plane..(c + 1) * plane];
            for y in 0..s {
                let row = &img.data
                    [((top + y) * img.side + left) * 3..((top + y) * img.side + left + s) * 3];
                let drow = &mut dst[y * s..(y + 1) * s];
                for (x, d) in drow.iter_mut().enumerate() {
                    let sx = if mirror { s - 1 - x } else { x };
                    *d = (row[sx * 3 + src_c] - mean) * scale;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_identity_is_exact() {
        let w = AxisWeights::new(500, 256);
        for (_, ws) in &w.taps {
            assert!((ws.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
        let mut img = RgbImage::new(256, 256);
        img.pixels_mut()
            .enumerate()
            .for_each(|(i, p)| p.0 = [(i % 251) as u8, (i % 13) as u8, 7]);
        let r = resize(&img, 256);
        assert!(
            r.data
                .iter()
                .zip(img.as_raw())
                .all(|(a, &b)| *a == b as f32)
        );
    }

    #[test]
    fn ten_crop_order() {
        let o = crop_origins(CropMode::Ten, 256, 224);
        assert_eq!(o[0], (0, 0, false));
        assert_eq!(o[1], (0, 32, false));
        assert_eq!(o[2], (32, 0, false));
        assert_eq!(o[4], (16, 16, false));
        assert_eq!(o[9], (16, 16, true));
    }

    #[test]
    fn windowed_is_the_whole_image_then_its_mirror() {
        let img = Resized {
            side: 4,
            data: (0..4 * 4 * 3).map(|i| i as f32).collect(),
        };
        let spec: VisionSpec = serde_json::from_value(serde_json::json!({
            "onnx": "v.onnx", "input_size": 2, "resize": 4, "crop_mode": "windowed",
            "color_order": "RGB", "mean": [0.0, 0.0, 0.0], "scale": [1.0, 1.0, 1.0],
            "taps": [], "raw_dim": 0, "input_name": "images", "output_name": "features"
        }))
        .expect("spec");
        assert_eq!(crop_len(&spec), 3 * 16);
        let mut out = vec![0f32; 2 * crop_len(&spec)];
        write_crops(&img, &spec, CropMode::Windowed, &mut out);
        // Red plane, row 1: pixels (1, 0..4) of the image, then mirrored.
        let red = |n: usize, y: usize| out[n * 48 + y * 4..n * 48 + y * 4 + 4].to_vec();
        assert_eq!(red(0, 1), [12.0, 15.0, 18.0, 21.0]);
        assert_eq!(red(1, 1), [21.0, 18.0, 15.0, 12.0]);
    }
}
