"""A bundle run end to end in Python: the reference that the server's path must reproduce.

Images: crops -> vision graph -> mean over crops -> FNE code -> W . code (+ bias) -> unit vector (as it is
under euclidean similarity). A bundle with several backbones runs each backbone's graph over the photo in its
own crop mode and preprocessing, and concatenates their codes in code order (docs/bundle.md, "Several
backbones").
Captions: tokenizer.json -> text graph -> the joint vector.
Scores: similarity + each image's hubness offset, when the bundle has a bank (it moves caption queries' rankings
of images), + each caption's offset, when it has the annotation side's bank of images (it moves image queries'
rankings of captions).
"""
from __future__ import annotations

import numpy as np

from ..text import tokenizer
from ..vision import features, fne
from . import contract, hubness, labels


class Pipeline:
    """`trained_words`: with a whole-vocabulary bundle (text.vocabulary), read captions through the trained graph
    and tokenizer it extends instead (every other word `<unk>`), to measure what the vocabulary adds."""

    def __init__(self, directory, threads: int = 0, trained_words: bool = False):
        import onnxruntime as ort

        self.bundle = contract.read(directory)
        m = self.bundle.manifest
        self.vision_sessions = [features.session(self.bundle.directory / v["onnx"], threads)
                                for v, _ in contract.backbones(m)]
        self.vision_session = self.vision_sessions[0]
        so = features.options(threads)
        text = m["text"]
        if trained_words:
            if "vocabulary" not in text:
                raise SystemExit(f"{directory}: no text.vocabulary, so its graph reads only its trained words already")
            text = text["vocabulary"]["from"]
        self.text_session = ort.InferenceSession(str(self.bundle.directory / text["onnx"]), so,
                                                 providers=["CPUExecutionProvider"])
        self.tok = tokenizer.load(self.bundle.directory / text["tokenizer"])
        self.m = m
        self.labels = labels.read(self.bundle.directory, m["labels"]) if "labels" in m else None

    def crop_modes(self, crop_mode: str | None = None) -> list[str]:
        """Each backbone's crop mode, or `crop_mode` for all of them: with several backbones, only the mode they
        all have (as the server's --crop-mode)."""
        own = [v["crop_mode"] for v, _ in contract.backbones(self.m)]
        if crop_mode is None:
            return own
        if len(own) > 1 and any(o != crop_mode for o in own):
            raise ValueError(f"crop mode {crop_mode!r}: this bundle's backbones run in their own modes {own}")
        return [crop_mode] * len(own)

    def raw_features(self, paths, crop_mode: str | None = None) -> np.ndarray:
        """[N, sum of raw_dim]: every backbone's features, side by side in code order."""
        return np.concatenate([features.embed_images(sess, v, paths, mode) for sess, (v, _), mode in
                               zip(self.vision_sessions, contract.backbones(self.m), self.crop_modes(crop_mode),
                                   strict=True)], axis=1)

    def codes(self, raw: np.ndarray) -> np.ndarray:
        """Each backbone's slice of `raw` (`raw_features`) coded with its own statistics and thresholds."""
        out, at = [], 0
        for b in self.bundle.backbones:
            f = b.fne
            out.append(fne.encode(raw[:, at:at + f["dim"]], b.mean, b.std, tuple(f["thresholds"]), f["std_eps"]))
            at += f["dim"]
        if at != raw.shape[1]:
            raise ValueError(f"features of width {raw.shape[1]}, the bundle's backbones take {at}")
        return np.concatenate(out, axis=1)

    def project(self, codes: np.ndarray) -> np.ndarray:
        v = codes.astype(np.float32) @ self.bundle.projection.T
        if self.bundle.bias is not None:
            v += self.bundle.bias
        if self.m["similarity"] == "euclidean":  # used as they are: no normalisation
            return v.astype(np.float32)
        n = np.linalg.norm(v, axis=1, keepdims=True)
        v = np.where(n > 0, v / np.where(n > 0, n, 1), 0).astype(np.float32)
        if self.labels is not None:  # cosine bundles only
            return labels.apply(v, codes, self.m["labels"], self.labels, self.bundle.hubness,
                                self.m.get("hubness", {}).get("k"))
        return np.abs(v) if self.m["projection"]["abs"] else v

    def embed_images(self, paths, crop_mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(int8 codes [N, D], unit vectors [N, joint_dim])."""
        c = self.codes(self.raw_features(paths, crop_mode))
        return c, self.project(c)

    def embed_texts(self, texts: list[str], batch: int = 256) -> np.ndarray:
        t = self.m["text"]
        out = []
        for k in range(0, len(texts), batch):
            ids, lengths = tokenizer.encode_batch(self.tok, texts[k : k + batch], t["max_tokens"])
            out.append(self.text_session.run([t["output_name"]], {t["ids_name"]: ids, t["lengths_name"]: lengths})[0])
        return np.concatenate(out) if out else np.zeros((0, self.m["projection"]["joint_dim"]), np.float32)

    def offsets(self, images: np.ndarray) -> np.ndarray:
        """Each image's search offset (docs/bundle.md, "The hubness section"); zeros without a hubness bank."""
        hb = self.m.get("hubness")
        if hb is None:
            return np.zeros(len(images), np.float32)
        return hubness.offsets(images, self.bundle.hubness, hb["k"], hb["alpha"])

    def caption_offsets(self, captions: np.ndarray) -> np.ndarray:
        """Each caption's annotation offset (the hubness section's `annotation`: the captions' vectors against
        the bank of training images); zeros without that bank."""
        an = self.m.get("hubness", {}).get("annotation")
        if an is None:
            return np.zeros(len(captions), np.float32)
        return hubness.offsets(captions, self.bundle.hubness_images, an["k"], an["alpha"])

    def scores(self, images: np.ndarray, captions: np.ndarray) -> np.ndarray:
        """[N_img, N_cap] as the server ranks: the similarity plus each image's offset (to every score of its
        row) plus each caption's offset (to every score of its column). Each direction's ranking moves only by
        the other side's offset: a caption query's ranking of images (a column) by the images' offsets, an image
        query's ranking of captions (a row) by the captions'; so both directions' metrics come from this."""
        return (similarities(images, captions, self.m["similarity"]) + self.offsets(images)[:, None]
                + self.caption_offsets(captions)[None, :])


def similarities(images: np.ndarray, captions: np.ndarray, similarity: str) -> np.ndarray:
    """[N_img, N_cap] in the bundle's similarity."""
    if similarity == "cosine":
        return images @ captions.T
    if similarity == "euclidean":
        from ..training.closed_form import neg_sqdist

        return neg_sqdist(images, captions).astype(np.float32)
    import torch

    from ..training.losses import order_scores_blocked

    return order_scores_blocked(torch.from_numpy(np.ascontiguousarray(images, np.float32)),
                                torch.from_numpy(np.ascontiguousarray(captions, np.float32))).numpy()
