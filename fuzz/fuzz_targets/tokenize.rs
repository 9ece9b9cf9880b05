//! Arbitrary text into the server's tokenisation (crates/embed/src/tokenize.rs) with the default bundle's tokenizer: a
//! sentence gives 1..=max_tokens ids inside the vocabulary (what the text graph can embed), or a 4xx-kind
//! error; never a tokenizer failure (which the API answers 500) and never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/embed/src/tokenize.rs"]
#[allow(dead_code)]
mod tokenize;

use tokenize::{TextError, TextTokenizer, pad};

struct Setup {
    tok: TextTokenizer,
    max_tokens: usize,
    vocab: usize,
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/flickr8k-vgg16-fne");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("bundle.json")).expect("bundle.json"))
                .expect("bundle.json is JSON");
        let text = &manifest["text"];
        let max_tokens = text["max_tokens"].as_u64().expect("max_tokens") as usize;
        let tok = TextTokenizer::from_file(
            &dir.join(text["tokenizer"].as_str().expect("tokenizer")),
            max_tokens,
            1000,
        )
        .expect("tokenizer loads");
        let vocab = tok.vocab_size();
        Setup { tok, max_tokens, vocab }
    })
}

fuzz_target!(|data: &[u8]| {
    let s = setup();
    let text = String::from_utf8_lossy(data);
    match s.tok.ids(&text) {
        Ok(ids) => {
            assert!(!ids.is_empty() && ids.len() <= s.max_tokens, "{} ids", ids.len());
            assert!(ids.iter().all(|&i| i >= 0 && (i as usize) < s.vocab), "id outside the vocabulary");
            let (batch, lengths, t) = pad(&[&ids, &ids[..1]], 0);
            assert_eq!((batch.len(), lengths[0] as usize), (2 * t, ids.len()));
        }
        Err(TextError::Tokenize(e)) => panic!("tokenizer failed on {text:?}: {e}"),
        Err(_) => {}
    }
});
