//! Arbitrary bytes into the server's image decoding (crates/embed/src/decode.rs): it must return an image within the limits
//! or an error, never panic past its own boundary, hang, or run out of memory.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/embed/src/decode.rs"]
#[allow(dead_code)]
mod decode;

fuzz_target!(
    init: {
        // libjpeg reports corrupt data by unwinding, which decode() catches (mozjpeg-sys `unwinding`); the
        // default libFuzzer hook would abort on that first. A panic that escapes decode() still aborts: the
        // harness catches it and reports a crash.
        std::panic::set_hook(Box::new(|_| {}));
    },
    |data: &[u8]| {
        let limits = decode::DecodeLimits {
            max_bytes: 1 << 20,
            max_pixels: 1 << 22,
            min_side: 1,
        };
        if let Ok(img) = decode::decode(data, &limits) {
            let (w, h) = img.dimensions();
            assert!(u64::from(w) * u64::from(h) <= limits.max_pixels, "{w}x{h} over the limit");
            assert_eq!(img.as_raw().len(), w as usize * h as usize * 3);
        }
    }
);
