"""The tiny fixture bundle for the server's tests: same tools, same format, random weights, a few hundred KB.

Its vision graph is VGG16-shaped (13 convs in 5 blocks, 224x224 input) but a few channels wide; its "training
set" is a handful of generated pictures (tests/fixtures/images, written here too, never dataset photos).
`parity.json` records what the trainer computes for those images and sentences, so the server can be checked
against it: identical ternary codes, joint vectors within 1e-5, each image's hubness offset (the bundle's bank
is its own captions, k 2, alpha 0.5) and each sentence's annotation offset (its bank of images is its own
images, k 2, alpha 0.5). `make_order` writes the same network as an order-embedding bundle
(`similarity: order`, `abs: true`, no bank), whose parity file adds the trainer's order scores S. `make_two`
writes a bundle with two backbones (docs/bundle.md, "Several backbones"): the VGG16-shaped network under ten
crops, then the EfficientNet-Lite-shaped one under the windowed mode, one projection over both codes.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..data import flickr8k, photos
from ..text import tokenizer
from ..training.model import TextEncoder
from ..vision import backbones, features, fne, images
from ..vision.backbones import effnet, vgg16
from . import conse, contract, hubness, labels, pipeline, writer

BLOCKS = ((4, 4), (8, 8), (8, 8, 8), (16, 16, 16), (16, 16, 16))
CAPTIONS = [
    "a red circle on a blue background .",
    "a green square in the middle of a white field",
    "two yellow stripes across a dark picture",
    "a small black dog runs on the beach",
    "children play football in a park .",
    "a grey cat sleeps on a red sofa",
]
SENTENCES = ["a red circle", "a dog on the beach", "zebra-striped spaceship!", "the"]
# EfficientNet's seven stages as (channels, blocks, kernel), a few channels wide.
EFFNET_STAGES = ((8, 1, 3), (12, 2, 3), (16, 2, 5), (20, 2, 3), (24, 1, 5), (28, 2, 5), (32, 1, 3))


def make_images(out: str | Path, seed: int = 7, prefix: str = "fixture") -> list[Path]:
    """Smooth synthetic pictures of several sizes and modes (RGB, RGBA, greyscale, palette)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    specs = [((224, 224), "RGB"), ((320, 200), "RGB"), ((96, 64), "RGBA"), ((256, 256), "L"),
             ((500, 375), "RGB"), ((150, 300), "P"), ((224, 224), "RGB"), ((640, 480), "RGB")]
    paths = []
    for k, ((w, h), mode) in enumerate(specs):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([(xx * rng.uniform(0.2, 1.2) + yy * rng.uniform(-0.5, 0.5) + rng.uniform(0, 255)) % 256
                         for _ in range(3)], -1).astype(np.uint8)
        im = Image.fromarray(base, "RGB")
        d = ImageDraw.Draw(im)
        for _ in range(4):
            x0, y0 = int(rng.uniform(0, w * 0.7)), int(rng.uniform(0, h * 0.7))
            box = [x0, y0, x0 + int(rng.uniform(10, w * 0.4)), y0 + int(rng.uniform(10, h * 0.4))]
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (d.ellipse if rng.uniform() < 0.5 else d.rectangle)(box, fill=colour)
        if mode == "RGBA":
            im = im.convert("RGBA")
            im.putalpha(Image.fromarray((xx * 255 // max(w - 1, 1)).astype(np.uint8)))
        elif mode in ("L", "P"):
            im = im.convert(mode)
        p = out / f"{prefix}_{k}.png"
        im.save(p, optimize=True)
        paths.append(p)
    return paths


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def make(out: str | Path, images_dir: str | Path, seed: int = 0) -> dict:
    paths = make_images(images_dir)
    weights = vgg16.random_vgg(BLOCKS, seed=seed)
    return _write(Path(out), "fixture-tiny", weights, vgg16.build_graph(weights, "post_relu"), "ten", paths,
                  images_dir, seed, cases=("ten", "center"))


def make_order(out: str | Path, images_dir: str | Path, seed: int = 0) -> dict:
    """fixture-tiny's network as an order-embedding bundle (Vendrov et al.: |unit vectors| on both sides,
    S(c, i) = -||max(0, c - i)||^2), under the centre crop, without a hubness bank (the bank offsets cosine
    scores only). Its parity file adds `order_scores`: S of every sentence against every fixture image, as
    the trainer ranks them, for the server's search and annotation paths to reproduce."""
    paths = make_images(images_dir)
    weights = vgg16.random_vgg(BLOCKS, seed=seed)
    return _write(Path(out), "fixture-tiny-order", weights, vgg16.build_graph(weights, "post_relu"), "center",
                  paths, images_dir, seed, cases=("center",), similarity="order")


def make_effnet(out: str | Path, images_dir: str | Path, seed: int = 0) -> dict:
    """An EfficientNet-Lite-shaped fixture (`effnet.random_state_dict`: seven stages, a few channels wide,
    RGB scaled as Lite2 is) under the windowed crop mode: crops of 64 read off a 128 image, so its taps are
    weighted at strides up to 32 and its stride-2 convolutions pad as TensorFlow does (after, not before)."""
    paths = make_images(images_dir)
    weights = effnet.from_state_dict(effnet.random_state_dict(EFFNET_STAGES, seed=seed))
    weights.input_size, weights.resize = 64, 128
    weights.backbone, weights.source = "efficientnet-lite (tiny fixture)", f"random, seed {seed}"
    graph = effnet.build_graph(weights, input_size=64, windowed_from=128)
    return _write(Path(out), "fixture-tiny-effnet", weights, graph, "windowed", paths, images_dir, seed,
                  cases=("windowed",))


def make_two(out: str | Path, images_dir: str | Path, seed: int = 0) -> dict:
    """Two backbones, unlike in crop mode, size and colour order: fixture-tiny's VGG16-shaped network (ten crops
    of 224 from 256, BGR) first, then fixture-tiny-effnet's EfficientNet-Lite-shaped one (windowed, crops of 64
    from 128, RGB in [-1, 1]) as `extra_backbones[0]`, each with its own FNE statistics of the fixture images;
    one random projection over the concatenated code, the fixtures' text side and banks, and parity cases in the
    backbones' own crop modes."""
    out = Path(out)
    paths = make_images(images_dir)
    vgg = vgg16.random_vgg(BLOCKS, seed=seed)
    eff = effnet.from_state_dict(effnet.random_state_dict(EFFNET_STAGES, seed=seed))
    eff.input_size, eff.resize = 64, 128
    eff.backbone, eff.source = "efficientnet-lite (tiny fixture)", f"random, seed {seed}"
    extra = {"vision": {"onnx": "vision-effnet.onnx", **backbones.vision_section(eff, "post_relu", "windowed"),
                        "prepare": flickr8k.PREPARATION}}
    out.mkdir(parents=True, exist_ok=True)
    backbones.save(effnet.build_graph(eff, input_size=64, windowed_from=128), out / extra["vision"]["onnx"])
    raw = features.embed_images(features.session(out / extra["vision"]["onnx"]), extra["vision"], paths, "windowed")
    contract.write_fne(out / "fne-effnet.safetensors", *fne.stats(raw))
    extra["fne"] = {"stats": "fne-effnet.safetensors", "dim": extra["vision"]["raw_dim"],
                    "thresholds": list(fne.THRESHOLDS), "std_eps": fne.STD_EPS}
    return _write(out, "fixture-tiny-two", vgg, vgg16.build_graph(vgg, "post_relu"), "ten", paths, images_dir,
                  seed, cases=(None,), extra_backbones=[extra])


def make_labels(src: str | Path, out: str | Path, seed: int = 0) -> dict:
    """fixture-tiny-effnet (`src`) with a labels section: five random classes read off its head features, random
    name vectors, the top two combined at weight 1, under a gate whose middle is its images' median nearness
    (so the gate lowers some images' weight and not others); its image bank and parity.json made again through
    it. Run from the repository root, where parity.json's `images_dir` is."""
    src, out = Path(src), Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    old = json.loads((src / "parity.json").read_text())
    paths = parity_images(src)
    p = pipeline.Pipeline(out)
    head = p.m["vision"]["taps"][-1]["channels"]
    rng = np.random.default_rng(seed)
    classes, joint = 5, p.m["projection"]["joint_dim"]
    built = {"plus": rng.normal(0, 1, (classes, head)).astype(np.float16),
             "minus": rng.normal(0, 1, (classes, head)).astype(np.float16),
             "bias": rng.normal(0, 0.5, classes).astype(np.float32),
             "vectors": labels.unit(rng.normal(0, 1, (classes, joint))).astype(np.float16)}
    near = labels.nearness(p.embed_images(paths)[1], p.bundle.hubness, p.m["hubness"]["k"])
    spec = {"classes": classes, "code_start": p.m["fne"]["dim"] - head, "top": 2, "weight": 1.0,
            "gate": {"middle": round(float(np.median(near)), 4), "slope": 20.0},
            "source": {"names": "random vectors (fixture)", "classifier": f"random, seed {seed}"}}
    m = conse.add(out, spec, built)
    contract.finish(out, {**{k: v for k, v in m.items() if k != "files"}, "name": "fixture-tiny-labels"})
    add_annotation_bank(out, paths)  # the bank of its images, now with their labels
    return write_parity(out, old["images_dir"], paths, photos_dir=Path(old["photos"]["dir"]),
                        name="fixture-tiny-labels", modes=("windowed",))


def _write(out: Path, name: str, weights, graph, crop_mode: str, paths: list[Path], images_dir, seed: int,
           cases: tuple[str | None, ...], similarity: str = "cosine", extra_backbones: list[dict] = ()) -> dict:
    """A fixture bundle of random weights: FNE statistics from the fixture images, a random projection, a random
    GRU text encoder (the same for every fixture of one seed), parity cases; a cosine one also gets a hubness
    bank of its captions and an annotation bank of its images. `extra_backbones`: sections (their files
    written) of backbones after this one, which the projection reads too."""
    out.mkdir(parents=True, exist_ok=True)
    vis = backbones.vision_section(weights, "post_relu", crop_mode)
    vis["prepare"] = flickr8k.PREPARATION  # as a Flickr8k bundle: the parity cases cover the squash
    backbones.save(graph, out / "vision.onnx")
    sess = features.session(out / "vision.onnx")
    raw = features.embed_images(sess, vis, paths, crop_mode)
    mean, std = fne.stats(raw)
    tok = tokenizer.build(CAPTIONS)
    torch.manual_seed(seed)
    joint = 16
    use_abs = similarity == "order"
    text = TextEncoder(tok.get_vocab_size(), 8, joint, use_abs=use_abs)
    code_dim = vis["raw_dim"] + sum(b["fne"]["dim"] for b in extra_backbones)
    w = np.random.default_rng(seed).normal(0, 0.1, (joint, code_dim)).astype(np.float32)
    writer.write(out, name=name, vision=vis, vision_onnx=out / "vision.onnx", fne_mean=mean,
                 fne_std=std, projection=w, text=text, tok=tok, max_tokens=16, similarity=similarity,
                 use_abs=use_abs, training={"dataset": "generated fixture pictures", "split": "all",
                                            "loss": "none (random weights)", "crop_mode": crop_mode})
    if extra_backbones:
        m = json.loads((out / "bundle.json").read_text())
        # After the first backbone's sections, where a reader looks for the others.
        m = {k2: v2 for k, v in m.items() if k != "files"
             for k2, v2 in ([(k, v), ("extra_backbones", list(extra_backbones))] if k == "fne" else [(k, v)])}
        contract.finish(out, m)
    if similarity == "cosine":
        add_hubness(out, paths)
    return write_parity(out, images_dir, paths, name=name, modes=cases)


def add_hubness(out: Path, paths: list[Path]) -> None:
    """A bank of the fixture's own captions, so that the server's tests cover the search offset, and one of its
    own images (`paths`), so that they cover the annotation offset."""
    p = pipeline.Pipeline(out)
    hubness.write(out / hubness.FILE, p.embed_texts(CAPTIONS))
    m = {k: v for k, v in p.m.items() if k != "files"}
    m["hubness"] = hubness.section(len(CAPTIONS), 2, 0.5, 0, "the fixture's captions, embedded by its text graph")
    contract.finish(out, m)
    add_annotation_bank(out, paths)


def add_annotation_bank(out: Path, paths: list[Path]) -> dict:
    """The annotation side of a fixture's hubness section: a bank of the images `paths` (the fixture's own),
    embedded by the bundle's own files in its crop mode, k 2, alpha 0.5; the other files stay as they are.
    Returns the manifest."""
    p = pipeline.Pipeline(out)
    hubness.write(out / hubness.IMAGES_FILE, p.embed_images(paths)[1])
    m = {k: v for k, v in p.m.items() if k != "files"}
    m["hubness"] = {**m["hubness"], "annotation": hubness.annotation(
        len(paths), 2, 0.5, "the fixture's images, embedded by its own files")}
    return contract.finish(out, m)


def parity_images(out: Path) -> list[Path]:
    """The fixture images a bundle's parity.json covers (its `images_dir` and case names, in case order)."""
    parity = json.loads((Path(out) / "parity.json").read_text())
    return [Path(parity["images_dir"]) / n for n in dict.fromkeys(c["image"] for c in parity["images"])]


def add_annotation(out: Path) -> dict:
    """Gives a written cosine fixture (a committed one) the annotation side without rewriting anything else: the
    bank of the images its parity.json covers, the manifest's section, and each parity sentence's "offset"
    (its vector checked against the bundle first); the other files' bytes and parity figures stay. Run from the
    repository root, where parity.json's `images_dir` is."""
    out = Path(out)
    add_annotation_bank(out, parity_images(out))
    parity = json.loads((out / "parity.json").read_text())
    p = pipeline.Pipeline(out)
    texts = _texts(p, [t["text"] for t in parity["texts"]])
    for old, new in zip(parity["texts"], texts, strict=True):
        if old["ids"] != new["ids"] or not np.allclose(old["vector"], new["vector"], atol=1e-6):
            raise ValueError(f"{out}/parity.json: {old['text']!r} is not what the bundle computes")
        old["offset"] = new["offset"]
    (out / "parity.json").write_text(json.dumps(parity, indent=1) + "\n")
    return parity


def make_windowed(src: str | Path, out: str | Path, seed: int = 0,
                  photos_dir: Path = photos.DEFAULT_DIR) -> dict:
    """The fixture under the `windowed` crop mode: the same random weights (checked against `src`'s graph),
    their windowed graph over the whole 256 image, `src`'s other files, and parity cases for the fixture
    images and the real photos in that mode."""
    src, out = Path(src), Path(out)
    weights = vgg16.random_vgg(BLOCKS, seed=seed)
    same = vgg16.build_graph(weights, "post_relu").SerializeToString(deterministic=True)
    if hashlib.sha256(same).hexdigest() != features.sha256_file(src / "vision.onnx"):
        raise ValueError(f"{src}/vision.onnx is not the seed-{seed} fixture graph: write that fixture first")
    m = contract.copy_except_vision(src, out, json.loads((src / "bundle.json").read_text()))
    backbones.save(vgg16.build_graph(weights, "post_relu", windowed_from=m["vision"]["resize"]),
                out / m["vision"]["onnx"])
    m["name"] = "fixture-tiny-windowed"
    m["vision"]["crop_mode"] = "windowed"
    contract.finish(out, m)
    src_parity = json.loads((src / "parity.json").read_text())
    images_dir = Path(src_parity["images_dir"])
    names = sorted({c["image"] for c in src_parity["images"]})
    if "annotation" in m.get("hubness", {}):  # src's bank of images is its graph's: this graph's instead
        add_annotation_bank(out, [images_dir / n for n in names])
    p = pipeline.Pipeline(out)
    parity = {"bundle": "fixture-tiny-windowed", "images_dir": str(images_dir),
              "images": _cases(p, [images_dir / n for n in names], ("windowed",)), "texts": [],
              "photos": {"source": photos.WHEEL, "dir": str(photos_dir),
                         "cases": _cases(p, photos.fetch(photos_dir), ("windowed",))}}
    (out / "parity.json").write_text(json.dumps(parity, indent=1) + "\n")
    return parity


def _cases(p: pipeline.Pipeline, paths: list[Path], modes: tuple[str | None, ...]) -> list[dict]:
    """Each photo in each of `modes`; None: in the bundle's own crop modes, recorded as they run, joined by "+"
    ("ten+windowed" for two backbones)."""
    cases = []
    for path in paths:
        # The photo as the bundle's preparation leaves it (8-bit RGB): the server's must be the same bytes.
        prepared = images.prepare(images.decode(str(path)), p.m["vision"].get("prepare"))
        digest = hashlib.sha256(np.ascontiguousarray(prepared).tobytes()).hexdigest()
        for mode in modes:
            c, v = p.embed_images([path], mode)
            cases.append({"image": path.name, "crop_mode": "+".join(p.crop_modes(mode)),
                          "prepared": [*prepared.shape[1::-1], digest], "code": b64(fne.pack(c[0])),
                          "nonzero": int(np.count_nonzero(c[0])), "vector": [float(x) for x in v[0]],
                          "offset": float(p.offsets(v)[0])})
    return cases


def _texts(p: pipeline.Pipeline, sentences: list[str]) -> list[dict]:
    """Each sentence's token ids, joint vector and annotation offset (0 without a bank of images)."""
    vecs = p.embed_texts(sentences)
    return [{"text": s, "ids": tokenizer.encode_batch(p.tok, [s], 16)[0][0].tolist(),
             "vector": [float(x) for x in vec], "offset": float(off)}
            for s, vec, off in zip(sentences, vecs, p.caption_offsets(vecs), strict=True)]


def write_parity(out: Path, images_dir, paths: list[Path], photos_dir: Path = photos.DEFAULT_DIR,
                 name: str = "fixture-tiny", modes: tuple[str | None, ...] = ("ten", "center")) -> dict:
    """Expected outputs, computed through the bundle as written (the server's tests compare against these):
    the generated fixture images in `modes`, and real camera-size photos (data/photos.py) in the first of them; for
    an order bundle, also the trainer's S of every sentence and fixture image."""
    p = pipeline.Pipeline(out)
    cases = _cases(p, paths, modes)
    real = _cases(p, photos.fetch(photos_dir), modes[:1])
    texts = _texts(p, SENTENCES)
    parity = {"bundle": name, "images_dir": str(Path(images_dir)), "images": cases, "texts": texts,
              "photos": {"source": photos.WHEEL, "dir": str(photos_dir), "cases": real}}
    if p.m["similarity"] == "order":
        # S of every sentence against every fixture image, for the server's search and annotation to reproduce.
        s = p.scores(p.embed_images(paths)[1], p.embed_texts(SENTENCES))
        parity["order_scores"] = {"images": [q.name for q in paths], "texts": SENTENCES,
                                  "scores": [[float(x) for x in row] for row in s]}
    (out / "parity.json").write_text(json.dumps(parity, indent=1) + "\n")
    return parity
