//! Step 1b: the training photos' own preparation. Flickr8k's photos were squashed to 224x224 with PIL's
//! bilinear filter before anything else; a camera-size upload must be squashed the same way, or the model
//! sees sharper, differently filtered pixels than it was trained on (docs/bundle.md, "The preparation").
//!
//! The resize is PIL's 8-bit `Image.resize` exactly: coefficients in f64, rounded to 22-bit fixed point,
//! the horizontal pass first, each pass rounded and clipped to 8 bits. A photo already of the prepared size
//! is left as it is (PIL returns a copy), so the dataset's own photos are unchanged, bit for bit.

use image::RgbImage;

use crate::bundle::{Prepare, PrepareFilter};

/// `img` prepared as the bundle's training photos were (unchanged without a `prepare` section).
pub fn apply(spec: Option<&Prepare>, img: RgbImage) -> RgbImage {
    match spec {
        Some(p) if img.dimensions() != (p.width(), p.height()) => {
            resize(&img, p.width(), p.height(), p.filter)
        }
        _ => img,
    }
}

/// Fixed-point precision of the coefficients (PIL: 32 bits less 8 for the value and 2 for overflow).
const PRECISION_BITS: u32 = 22;

impl PrepareFilter {
    fn support(self) -> f64 {
        match self {
            PrepareFilter::Bilinear => 1.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            PrepareFilter::Bilinear => {
                let x = x.abs();
                if x < 1.0 { 1.0 - x } else { 0.0 }
            }
        }
    }
}

/// One axis: for every output position, the first input index and its fixed-point weights.
struct Axis {
    taps: Vec<(usize, Vec<i32>)>,
}

impl Axis {
    fn new(in_size: u32, out_size: u32, filter: PrepareFilter) -> Axis {
        let scale = f64::from(in_size) / f64::from(out_size);
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let taps = (0..out_size)
            .map(|xx| {
                let center = (f64::from(xx) + 0.5) * scale;
                // `as i32` truncates toward zero, as C's (int) does.
                let xmin = ((center - support + 0.5) as i32).max(0);
                let xmax = ((center + support + 0.5) as i32).min(in_size as i32) - xmin;
                // Times the reciprocal, not divided by the scale: PIL's rounding, to the last bit.
                let ss = 1.0 / filterscale;
                let w: Vec<f64> = (0..xmax.max(0))
                    .map(|x| filter.weight((f64::from(x + xmin) - center + 0.5) * ss))
                    .collect();
                let total: f64 = w.iter().sum();
                let one = f64::from(1u32 << PRECISION_BITS);
                let fixed = w
                    .iter()
                    .map(|&k| {
                        let k = if total != 0.0 { k / total } else { k };
                        if k < 0.0 {
                            (-0.5 + k * one) as i32
                        } else {
                            (0.5 + k * one) as i32
                        }
                    })
                    .collect();
                (xmin as usize, fixed)
            })
            .collect();
        Axis { taps }
    }
}

/// A rounded, clipped 8-bit value from a fixed-point sum (which starts at one half for the rounding).
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Which pass PIL (Pillow 13, the trainer's pinned version) runs first: the vertical one when the photo loses
/// more than twice as many rows as it loses columns (none when it gains them), else the horizontal one.
/// Each pass rounds to 8 bits, so the order shows in the pixels. Found by comparing both orders with
/// Pillow's output over hundreds of random sizes (docs/bundle.md, "The preparation"); the parity tests hold
/// it to the trainer's.
fn vertical_first(w_in: u32, h_in: u32, width: u32, height: u32) -> bool {
    let rows_lost = i64::from(h_in) - i64::from(height);
    let columns_lost = (i64::from(w_in) - i64::from(width)).max(0);
    rows_lost > 2 * columns_lost
}

fn resize(img: &RgbImage, width: u32, height: u32, filter: PrepareFilter) -> RgbImage {
    let (w_in, h_in) = img.dimensions();
    let ax = Axis::new(w_in, width, filter);
    let ay = Axis::new(h_in, height, filter);
    let out = if vertical_first(w_in, h_in, width, height) {
        let tmp = vertical(img.as_raw(), w_in, &ay);
        horizontal(&tmp, w_in, width, &ax)
    } else {
        let tmp = horizontal(img.as_raw(), w_in, width, &ax);
        vertical(&tmp, width, &ay)
    };
    RgbImage::from_raw(width, height, out).expect("the buffer is width x height x 3")
}

/// Every row of `src` (`w_in` pixels wide) resampled to `w_out` pixels.
fn horizontal(src: &[u8], w_in: u32, w_out: u32, ax: &Axis) -> Vec<u8> {
    let half = 1i32 << (PRECISION_BITS - 1);
    let (stride_in, stride_out) = (w_in as usize * 3, w_out as usize * 3);
    let mut out = vec![0u8; src.len() / stride_in * stride_out];
    for (row_in, row_out) in src
        .chunks_exact(stride_in)
        .zip(out.chunks_exact_mut(stride_out))
    {
        for ((lo, ks), px) in ax.taps.iter().zip(row_out.chunks_exact_mut(3)) {
            let mut acc = [half; 3];
            for (i, &k) in ks.iter().enumerate() {
                let p = &row_in[(lo + i) * 3..(lo + i) * 3 + 3];
                for c in 0..3 {
                    acc[c] += i32::from(p[c]) * k;
                }
            }
            for c in 0..3 {
                px[c] = clip8(acc[c]);
            }
        }
    }
    out
}

/// Every column of `src` (`w` pixels wide) resampled to as many rows as `ay` has taps.
fn vertical(src: &[u8], w: u32, ay: &Axis) -> Vec<u8> {
    let half = 1i32 << (PRECISION_BITS - 1);
    let stride = w as usize * 3;
    let mut out = vec![0u8; ay.taps.len() * stride];
    let mut acc = vec![half; stride];
    for ((lo, ks), row_out) in ay.taps.iter().zip(out.chunks_exact_mut(stride)) {
        acc.fill(half);
        for (i, &k) in ks.iter().enumerate() {
            let row = &src[(lo + i) * stride..(lo + i + 1) * stride];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += i32::from(v) * k;
            }
        }
        for (o, &a) in row_out.iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Prepare {
        serde_json::from_str(r#"{"resize": [224, 224], "filter": "bilinear"}"#).expect("spec")
    }

    fn noise(w: u32, h: u32) -> RgbImage {
        let mut s = 12345u32;
        RgbImage::from_fn(w, h, |_, _| {
            let mut px = [0u8; 3];
            for p in &mut px {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                *p = (s >> 23) as u8;
            }
            image::Rgb(px)
        })
    }

    #[test]
    fn a_photo_of_the_prepared_size_is_left_alone() {
        let img = noise(224, 224);
        assert_eq!(apply(Some(&spec()), img.clone()), img);
        assert_eq!(apply(None, noise(300, 200)).dimensions(), (300, 200));
    }

    #[test]
    fn a_larger_photo_is_squashed_to_the_prepared_size() {
        let out = apply(Some(&spec()), noise(451, 300));
        assert_eq!(out.dimensions(), (224, 224));
        // A flat photo stays flat: the weights of every output pixel sum to one in fixed point.
        let flat = RgbImage::from_pixel(640, 480, image::Rgb([17, 128, 255]));
        let out = apply(Some(&spec()), flat);
        assert!(out.pixels().all(|p| p.0 == [17, 128, 255]));
    }

    #[test]
    fn the_pass_order_follows_pils() {
        // Camera-size landscapes and squares: columns first; tall portraits: rows first.
        assert!(!vertical_first(2000, 1500, 224, 224));
        assert!(!vertical_first(1500, 2000, 224, 224));
        assert!(vertical_first(300, 451, 224, 224));
        assert!(vertical_first(640, 1136, 224, 224));
        assert!(!vertical_first(96, 64, 224, 224), "both axes grow");
        assert!(vertical_first(240, 150, 300, 100), "wider, and fewer rows");
    }

    #[test]
    fn weights_match_pils_for_a_halving() {
        // 448 -> 224: support 2, four taps per output pixel of 1/8, 3/8, 3/8, 1/8 (PIL's bilinear).
        let a = Axis::new(448, 224, PrepareFilter::Bilinear);
        let one: i32 = 1 << PRECISION_BITS;
        assert_eq!(a.taps[0].0, 0);
        // At the edge: three taps, 3/7, 3/7, 1/7 after normalising, rounded half up.
        let edge =
            [3.0 / 7.0, 3.0 / 7.0, 1.0 / 7.0].map(|k: f64| (0.5 + k * f64::from(one)) as i32);
        assert_eq!(a.taps[0].1, edge);
        assert_eq!(edge[0], 1_797_559);
        assert_eq!(a.taps[5].0, 9);
        assert_eq!(a.taps[5].1, [one / 8, one * 3 / 8, one * 3 / 8, one / 8]);
    }
}
