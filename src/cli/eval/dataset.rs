//! Flickr8k on disk: the caption file and the official split lists.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

/// Flickr8k token format: `<image>#<n>\t<caption>`; captions grouped by image, in file order.
pub fn read_captions(path: &Path) -> anyhow::Result<HashMap<String, Vec<String>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(parse_captions(&text))
}

fn parse_captions(text: &str) -> HashMap<String, Vec<String>> {
    let mut caps: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some((key, caption)) = line.split_once('\t') else {
            continue;
        };
        let name = key.split('#').next().unwrap_or(key);
        caps.entry(name.to_string())
            .or_default()
            .push(caption.trim().to_string());
    }
    caps
}

/// One split of the dataset: its images (in list order, each with a file and captions) and their first
/// five captions.
pub(super) struct Split {
    pub images_dir: PathBuf,
    pub names: Vec<String>,
    pub captions: HashMap<String, Vec<String>>,
}

/// Reads split `split` (train, dev or test) of the dataset at `data`, at most `limit` images.
pub(super) fn read_split(data: &Path, split: &str, limit: Option<usize>) -> anyhow::Result<Split> {
    let file = match split {
        "train" => "Flickr_8k.trainImages.txt",
        "dev" => "Flickr_8k.devImages.txt",
        "test" => "Flickr_8k.testImages.txt",
        other => bail!("unknown split \"{other}\"; use train, dev or test"),
    };
    let captions = read_captions(&data.join("Flickr8k.token.txt"))?;
    let images_dir = data.join("images");
    let mut names: Vec<String> = std::fs::read_to_string(data.join(file))
        .with_context(|| format!("cannot read the split list {file} in {}", data.display()))?
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && images_dir.join(n).is_file() && captions.contains_key(*n))
        .map(String::from)
        .collect();
    if let Some(l) = limit {
        names.truncate(l);
    }
    let captions = names
        .iter()
        .map(|n| (n.clone(), captions[n].iter().take(5).cloned().collect()))
        .collect();
    Ok(Split {
        images_dir,
        names,
        captions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captions_group_by_image_in_file_order() {
        let caps = parse_captions(
            "a.jpg#0\tA dog runs .\n\nb.jpg#0\tA cat .\na.jpg#1\t  A dog jumps .  \nno tab here\n",
        );
        assert_eq!(caps["a.jpg"], ["A dog runs .", "A dog jumps ."]);
        assert_eq!(caps["b.jpg"], ["A cat ."]);
        assert_eq!(caps.len(), 2);
    }

    #[test]
    fn a_split_keeps_listed_images_with_a_file_and_captions() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("images")).expect("mkdir");
        for n in ["a.jpg", "b.jpg"] {
            std::fs::write(dir.path().join("images").join(n), b"x").expect("write");
        }
        let token: String = (0..6)
            .map(|i| format!("a.jpg#{i}\tcaption {i}\n"))
            .collect();
        std::fs::write(
            dir.path().join("Flickr8k.token.txt"),
            token + "b.jpg#0\tb\n",
        )
        .expect("write");
        // c.jpg has no file, d.jpg no captions: both left out.
        std::fs::write(
            dir.path().join("Flickr_8k.testImages.txt"),
            "a.jpg\nc.jpg\nb.jpg\n",
        )
        .expect("write");
        let s = read_split(dir.path(), "test", None).expect("split");
        assert_eq!(s.names, ["a.jpg", "b.jpg"]);
        assert_eq!(s.captions["a.jpg"].len(), 5, "the first five captions");
        assert_eq!(
            read_split(dir.path(), "test", Some(1))
                .expect("split")
                .names,
            ["a.jpg"]
        );
        let e = read_split(dir.path(), "val", None)
            .err()
            .expect("unknown split");
        assert!(e.to_string().contains("use train, dev or test"), "{e}");
    }
}
