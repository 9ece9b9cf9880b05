"""Flickr8k as laid out in ../shared/data/flickr8k: images/, Flickr8k.token.txt and the official splits."""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# How the dataset's photos were prepared before anything else (its README: "already resized (squashed, aspect
# not kept) to 224x224"; bilinear reproduces them from the originals most closely of PIL's filters). A bundle
# trained on them records it, and the server prepares every photo the same way (docs/bundle.md).
PREPARATION = {"resize": [224, 224], "filter": "bilinear"}

SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "dev": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}


@dataclass
class Split:
    name: str
    images: list[str]          # image file names, in the split file's order
    captions: list[list[str]]  # five captions per image, same order

    def flat_captions(self) -> tuple[list[str], list[int]]:
        """All captions and, for each, the index of its image."""
        caps, owner = [], []
        for i, cs in enumerate(self.captions):
            caps.extend(cs)
            owner.extend([i] * len(cs))
        return caps, owner


def held_out_words(words: str) -> list[str]:
    """The words of a comma-separated list, lower case."""
    return [w.strip().lower() for w in words.split(",") if w.strip()]


def held_out_forms(words: str) -> set[str]:
    """The words of a comma-separated list and their plurals (+s, +es, y -> ies), lower case."""
    out = set()
    for w in held_out_words(words):
        out |= {w, w + "s", w + "es"} | ({w[:-1] + "ies"} if w.endswith("y") else set())
    return out


def without_words(split: Split, forms: set[str]) -> Split:
    """The split with every word in `forms` taken out of its captions (the held-out-word experiment: the model
    never reads them, so a query with one finds its images only through what the word vectors know)."""
    def strip(c: str) -> str:
        kept = [t for t in re.findall(r"\w+|[^\w\s]+", c) if t.lower() not in forms]
        return " ".join(kept)

    return Split(split.name, split.images, [[strip(c) for c in cs] for cs in split.captions])


def load_captions(root: str | Path) -> dict[str, list[str]]:
    caps: dict[str, list[str]] = defaultdict(list)
    for line in (Path(root) / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        key, text = line.split("\t", 1)
        name = key.split("#", 1)[0]
        caps[name].append(text.strip())
    return caps


def load_split(root: str | Path, split: str) -> Split:
    root = Path(root)
    names = [n.strip() for n in (root / SPLIT_FILES[split]).read_text().splitlines() if n.strip()]
    caps = load_captions(root)
    names = [n for n in names if (root / "images" / n).exists() and n in caps]
    return Split(split, names, [caps[n][:5] for n in names])


def all_images(root: str | Path) -> list[str]:
    """train, dev, test names in that order: the order of the feature cache."""
    return [n for s in ("train", "dev", "test") for n in load_split(root, s).images]
