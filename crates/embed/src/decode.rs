//! Step 1: bytes -> 8-bit RGB, with limits checked before any pixel is allocated.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, RgbImage};

#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    pub max_bytes: usize,
    /// Width x height; checked from the header, so a decompression bomb never allocates.
    pub max_pixels: u64,
    /// Smaller images carry too little signal to embed; 1x1 "images" are usually tracking pixels.
    pub min_side: u32,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_bytes: 20 << 20,
            max_pixels: 40_000_000,
            min_side: 16,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the image is empty (0 bytes)")]
    Empty,
    #[error("the image is {bytes} bytes; the limit is {max} bytes")]
    TooManyBytes { bytes: usize, max: usize },
    #[error("the data is not an image in a supported format (JPEG, PNG, WebP, GIF, BMP)")]
    UnknownFormat,
    #[error("the image is {width}x{height} pixels; the limit is {max} pixels in all")]
    TooManyPixels { width: u32, height: u32, max: u64 },
    #[error("the image is {width}x{height} pixels; each side must be at least {min} pixels")]
    TooSmall { width: u32, height: u32, min: u32 },
    #[error("the {format} image cannot be decoded (corrupt or truncated): {reason}")]
    Corrupt {
        format: &'static str,
        reason: String,
    },
}

fn format_name(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::Png => "PNG",
        ImageFormat::WebP => "WebP",
        ImageFormat::Gif => "GIF",
        ImageFormat::Bmp => "BMP",
        _ => "image",
    }
}

/// Decodes to RGB8: alpha is dropped and grey is replicated, as the trainer's reference does.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<RgbImage, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(DecodeError::TooManyBytes {
            bytes: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let format = image::guess_format(bytes).map_err(|_| DecodeError::UnknownFormat)?;
    if !matches!(
        format,
        ImageFormat::Jpeg
            | ImageFormat::Png
            | ImageFormat::WebP
            | ImageFormat::Gif
            | ImageFormat::Bmp
    ) {
        return Err(DecodeError::UnknownFormat);
    }
    let corrupt = |e: image::ImageError| DecodeError::Corrupt {
        format: format_name(format),
        reason: e.to_string(),
    };
    let reader = || ImageReader::with_format(Cursor::new(bytes), format);
    let (width, height) = reader().into_dimensions().map_err(corrupt)?;
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(DecodeError::TooManyPixels {
            width,
            height,
            max: limits.max_pixels,
        });
    }
    if width < limits.min_side || height < limits.min_side {
        return Err(DecodeError::TooSmall {
            width,
            height,
            min: limits.min_side,
        });
    }
    if format == ImageFormat::Jpeg {
        return decode_jpeg(bytes).map_err(|reason| DecodeError::Corrupt {
            format: "JPEG",
            reason,
        });
    }
    let mut reader = reader();
    let mut l = image::Limits::default();
    l.max_image_width = Some(width);
    l.max_image_height = Some(height);
    // Room for the decoded buffer at 16 bits x 4 channels plus the decoder's own scratch.
    l.max_alloc = Some(u64::from(width) * u64::from(height) * 16 + (64 << 20));
    reader.limits(l);
    Ok(reader.decode().map_err(corrupt)?.into_rgb8())
}

/// JPEG goes through libjpeg-turbo's decoder (ISLOW IDCT, fancy upsampling), as in PIL: the pure-Rust decoder
/// differs by up to 4 levels on a fifth of the pixels, enough to move ternary codes away from the trainer's.
fn decode_jpeg(bytes: &[u8]) -> Result<RgbImage, String> {
    // libjpeg pads a truncated stream with grey and only warns; PIL refuses it, and so do we.
    let tail = &bytes[bytes.len().saturating_sub(64)..];
    if !tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
        return Err("the data ends before the end-of-image marker (truncated)".into());
    }
    // libjpeg reports fatal errors by unwinding (mozjpeg-sys `unwinding`); catch them here.
    std::panic::catch_unwind(|| -> Result<RgbImage, String> {
        let d = mozjpeg::Decompress::new_mem(bytes).map_err(|e| e.to_string())?;
        let mut d = d.rgb().map_err(|e| e.to_string())?;
        let (w, h) = (d.width() as u32, d.height() as u32);
        let data: Vec<u8> = d.read_scanlines().map_err(|e| e.to_string())?;
        d.finish().map_err(|e| e.to_string())?;
        RgbImage::from_raw(w, h, data).ok_or_else(|| "decoder returned a short buffer".to_string())
    })
    .unwrap_or_else(|p| {
        Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libjpeg failed".into()))
    })
    .or_else(|e| {
        // libjpeg cannot convert CMYK/YCCK to RGB; the image crate can (PIL does too).
        if e.contains("color conversion") || e.contains("colorspace") {
            image::load_from_memory_with_format(bytes, ImageFormat::Jpeg)
                .map(|i| i.into_rgb8())
                .map_err(|e| e.to_string())
        } else {
            Err(e)
        }
    })
}
