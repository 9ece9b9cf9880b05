//! JPEG decoding matches PIL (libjpeg-turbo) bit for bit: the trainer decodes with PIL, so any other decoder
//! would move ternary codes. The expected hashes are sha256 of PIL 13's `Image.open(p).convert("RGB")` bytes
//! (4:2:0 at quality 90 and 4:4:4 at quality 75, made from the fixture pictures).

use jointspace_embed::decode::{DecodeError, DecodeLimits, decode};
use sha2::{Digest, Sha256};

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/jpeg/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture")
}

#[test]
fn jpeg_pixels_equal_pil() {
    for (name, w, h, want) in [
        (
            "fixture_4_q90.jpg",
            500,
            375,
            "d642b6f1eeb658cefe6e008a50253b0001ef4947a2e9e9e29bb6d5434beb0f3e",
        ),
        (
            "fixture_5_q75.jpg",
            150,
            300,
            "b61ec55590c5f2a0614e6f37147c008a011976278e293f6712d68842d67b5e61",
        ),
    ] {
        let img = decode(&read(name), &DecodeLimits::default()).expect("decodes");
        assert_eq!(img.dimensions(), (w, h), "{name}");
        assert_eq!(
            hex::encode(Sha256::digest(img.as_raw())),
            want,
            "{name}: pixels differ from PIL's"
        );
    }
}

#[test]
fn truncated_and_corrupt_jpegs_are_refused() {
    let data = read("fixture_4_q90.jpg");
    let e = decode(&data[..data.len() * 2 / 3], &DecodeLimits::default()).expect_err("truncated");
    assert!(matches!(e, DecodeError::Corrupt { .. }), "{e}");
    let mut garbled = data.clone();
    for b in garbled[600..900].iter_mut() {
        *b = 0xFF;
    }
    // Either refused or decoded, but never a panic or an abort.
    let _ = decode(&garbled, &DecodeLimits::default());
    let e = decode(&data[..200], &DecodeLimits::default()).expect_err("header only");
    assert!(matches!(e, DecodeError::Corrupt { .. }), "{e}");
}
