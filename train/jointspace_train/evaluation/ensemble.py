"""Metrics of runs, of their mean similarity and of them stacked, optionally with hubness offsets (the `ensemble`
command)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..training.inputs import Extraction, Features, prepare
from ..training.run_dirs import models_of, run_model
from ..vision.weights import VisionWeights
from . import retrieval


@dataclass(frozen=True)
class Ensemble:
    """The runs, the features they were trained on, the split they are measured on, the hubness settings."""

    source: VisionWeights
    extraction: Extraction
    tap_point: str
    crop: str
    split: str
    hubs: tuple[tuple[int, float], ...]  # (k, alpha) of each --hub
    runs: tuple[str, ...]


def ensemble(s: Ensemble) -> None:
    """Each run's metrics on a split, then those of the mean of their similarity matrices. The runs must share
    what their inputs depend on (image input, vocabulary, similarity); --crop and --tap-point say which
    features they were trained on.

    For cosine runs it also measures them stacked as one bundle could hold them without a new contract: W is
    the members' W one above the other (the joint vector is normalised as a whole, not per member) and the
    text vector is the members' unit vectors side by side over sqrt(K). That is the mean of the cosines only
    where the members' |W . code| agree, so it is measured, not assumed."""
    from ..training.loop import Encoded, encode_texts, image_vectors, sims
    from ..training.losses import similarity_of
    from ..training.model import stack

    models = [(Path(r), *run_model(Path(r))) for r in s.runs]
    shared = ("image_input", "min_count", "max_tokens", "use_abs")
    s0 = models[0][2]
    for run, _, st in models[1:]:
        differ = [k for k in shared if st[k] != s0[k]]
        if similarity_of(st["loss"]) != similarity_of(s0["loss"]):
            differ.append("similarity")
        if differ:
            sys.exit(f"{run} differs from {models[0][0]} in {', '.join(differ)}: their scores cannot be averaged")
    similarity = similarity_of(s0["loss"])
    hubs = list(s.hubs)
    if hubs and similarity != "cosine":
        sys.exit("--hub offsets cosine scores; these runs use the order similarity")
    d = prepare(s.source, s.extraction, Features(tap_point=s.tap_point, crop=s.crop, input=s0["image_input"]),
                s0["min_count"])
    split = Encoded(d.inputs[s.split], d.splits[s.split].captions, d.tok, s0["max_tokens"])
    # the hub correction's bank: the training captions, which no dev or test image owns
    bank = Encoded(d.inputs["train"], d.splits["train"].captions, d.tok, s0["max_tokens"]) if hubs else None
    built = models_of(d, [m for _, m, _ in models], [st for _, _, st in models])

    def scores(proj, text):
        """The split's [images, captions] similarities and, with --hub, its images' against the bank."""
        proj.eval(), text.eval()
        im = image_vectors(proj, split)
        sim = sims(proj, text, split, similarity, images=im)
        if not hubs:
            return sim, None
        return sim, (im @ encode_texts(text, bank.ids, bank.lengths).t()).numpy()

    def line(key, value, sim, b):
        out = {key: value, s.split: retrieval.metrics(sim, split.owner)}
        if hubs:
            out["hub"] = [{"k": k, "alpha": a, s.split: retrieval.metrics(sim + retrieval.hub_bias(b, k, a)[:, None],
                                                                         split.owner)} for k, a in hubs]
        print(json.dumps(out))

    total = total_bank = None
    for (run, _, _), (proj, text) in zip(models, built):
        sim, b = scores(proj, text)
        total = sim if total is None else total + sim
        if hubs:
            total_bank = b if total_bank is None else total_bank + b
        line("run", str(run), sim, b)
    runs = [str(r) for r, _, _ in models]
    line("ensemble", runs, total / len(models), None if total_bank is None else total_bank / len(models))
    if similarity == "cosine":
        line("stacked", runs, *scores(*stack([p for p, _ in built], [t for _, t in built])))
