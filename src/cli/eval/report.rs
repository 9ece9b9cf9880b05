//! What `eval` prints: the server's figures beside the trainer's recorded ones and their difference, as a
//! table or as JSON.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::metrics::{KEYS, round2};

pub(super) struct Report<'a> {
    pub bundle: &'a str,
    pub split: &'a str,
    pub crop_mode: String,
    pub images: usize,
    pub captions: usize,
    pub ingest_seconds: f64,
    pub index_recall: f64,
    /// The server's figures, by `KEYS`.
    pub ours: [f64; 9],
    /// The bundle's `training.test_metrics` (Null when it has none).
    pub theirs: Value,
}

impl Report<'_> {
    fn ours(&self) -> BTreeMap<&'static str, f64> {
        KEYS.iter()
            .zip(self.ours)
            .map(|(k, v)| (*k, round2(v)))
            .collect()
    }

    fn theirs(&self, k: &str) -> Option<f64> {
        self.theirs.get(k).and_then(Value::as_f64)
    }

    fn difference(&self) -> BTreeMap<&'static str, Option<f64>> {
        let ours = self.ours();
        KEYS.iter()
            .map(|k| (*k, self.theirs(k).map(|v| round2(ours[k] - v))))
            .collect()
    }

    pub fn json(&self) -> Value {
        json!({
            "bundle": self.bundle, "split": self.split, "images": self.images, "captions": self.captions,
            "crop_mode": self.crop_mode,
            "ingest_seconds": round2(self.ingest_seconds),
            "index_recall_at_10": (self.index_recall * 1000.0).round() / 1000.0,
            "metrics": self.ours(), "trainer_test_metrics": self.theirs, "difference": self.difference(),
        })
    }

    pub fn table(&self) -> String {
        let (ours, diff) = (self.ours(), self.difference());
        let mut out = format!(
            "bundle {}  split {}  {} images, {} captions  (ingest {:.1}s; HNSW recall@10 {:.3})\n",
            self.bundle,
            self.split,
            self.images,
            self.captions,
            self.ingest_seconds,
            self.index_recall
        );
        out.push_str(&format!(
            "{:<10} {:>9} {:>9} {:>9}\n",
            "metric", "server", "trainer", "diff"
        ));
        for k in KEYS {
            out.push_str(&format!(
                "{:<10} {:>9.2} {:>9} {:>9}\n",
                k,
                ours[k],
                self.theirs(k).map_or("-".into(), |v| format!("{v:.2}")),
                diff[k].map_or("-".into(), |v| format!("{v:+.2}"))
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(theirs: Value) -> Report<'static> {
        Report {
            bundle: "b@1",
            split: "test",
            crop_mode: "ten".into(),
            images: 2,
            captions: 10,
            ingest_seconds: 1.234,
            index_recall: 0.99951,
            ours: [50.0, 100.0, 100.0, 1.5, 10.0, 60.0, 90.0, 4.0, 410.0],
            theirs,
        }
    }

    #[test]
    fn differences_are_against_the_trainers_figures() {
        let r = report(json!({"i2t_r1": 49.5, "rsum": 410.004}));
        let j = r.json();
        assert_eq!(j["difference"]["i2t_r1"], json!(0.5));
        assert_eq!(j["difference"]["rsum"], json!(-0.0));
        assert_eq!(j["difference"]["t2i_r1"], Value::Null, "no trainer figure");
        assert_eq!(j["index_recall_at_10"], json!(1.0));
        assert_eq!(j["ingest_seconds"], json!(1.23));
        let t = r.table();
        assert!(
            t.contains("i2t_r1         50.00     49.50     +0.50"),
            "{t}"
        );
        assert!(
            t.contains("t2i_r1         10.00         -         -"),
            "{t}"
        );
        assert_eq!(t.lines().count(), 2 + KEYS.len());
    }
}
