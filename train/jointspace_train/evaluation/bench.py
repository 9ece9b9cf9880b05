"""The Python side of the benchmarks (docs/benchmarks.md; scripts/bench.sh runs it next to the server's).

`ingest`: the bundle's image path in Python on the same images, crop mode, batching and thread count as the
server's bench: PIL decode -> the reference resize and crops (vision/images.py) -> the vision graph -> FNE -> W.code,
with the graph run by onnxruntime-python (the bundle's vision.onnx) or by PyTorch eager (the same weights,
read out of that vision.onnx, as torch modules). `text`: a whole-vocabulary bundle's cost per sentence against the
trained graph it extends (`text.vocabulary.from`), interleaved rounds of test captions one at a time.
`sgemm`: the machine's FLOP rate on a large SGEMM (numpy's
OpenBLAS and torch's MKL) at the same thread count, and the graph's FLOP count, for the fraction of peak.
Each prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..bundle import contract
from ..vision import features, fne, images
from ..vision.backbones.vgg16 import VggWeights


def weights_from_graph(path: str | Path) -> VggWeights:
    """The conv weights of a vision.onnx written by vgg16.build_graph (initializers `<layer>_W`, `<layer>_b`),
    so that PyTorch runs exactly what onnxruntime runs."""
    inits = {t.name: t for t in onnx.load(str(path)).graph.initializer}
    names = [n[:-2] for n in inits if n.endswith("_W") and n.startswith("block")]
    names.sort(key=lambda n: (int(n[5:n.index("_")]), int(n.rsplit("conv", 1)[1])))
    if not names or any(n.startswith("fc") for n in inits):
        raise ValueError(f"{path}: expected a conv-only VGG graph from vgg16.build_graph")
    convs = [(n, numpy_helper.to_array(inits[f"{n}_W"]), numpy_helper.to_array(inits[f"{n}_b"])) for n in names]
    blocks: dict[int, list[int]] = {}
    for n, w, _ in convs:
        blocks.setdefault(int(n[5:n.index("_")]), []).append(w.shape[0])
    return VggWeights(convs=convs, blocks=tuple(tuple(blocks[b]) for b in sorted(blocks)), source=str(path))


def torch_model(weights: VggWeights):
    """The FNE graph in PyTorch eager: conv -> ReLU (tapped: spatial mean) per layer, max-pool per block."""
    import torch
    from torch import nn

    class Fne(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList()
            for _, w, b in weights.convs:
                conv = nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1)
                conv.weight.data = torch.from_numpy(np.array(w, np.float32))
                conv.bias.data = torch.from_numpy(np.array(b, np.float32))
                self.convs.append(conv)
            self.ends = set(np.cumsum([len(b) for b in weights.blocks]) - 1)

        def forward(self, x):
            taps = []
            for i, conv in enumerate(self.convs):
                x = torch.relu(conv(x))
                taps.append(x.mean(dim=(2, 3)))
                if i in self.ends:
                    x = torch.nn.functional.max_pool2d(x, 2)
            return torch.cat(taps, dim=1)

    return Fne().eval()


def graph_flops(weights: VggWeights, input_size: int) -> float:
    """FLOPs (2 per multiply-add) of the convolutions for one crop; pooling, ReLU and means are noise."""
    total, side, i = 0.0, input_size, 0
    for block in weights.blocks:
        for _ in block:
            _, w, _ = weights.convs[i]
            total += 2.0 * w.shape[0] * w.shape[1] * 9 * side * side
            i += 1
        side //= 2
    return total


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def image_names(folder: str, listing: str | None, n: int) -> list[str]:
    if listing:
        names = [x.strip() for x in Path(listing).read_text().splitlines() if x.strip()]
    else:
        names = sorted(os.listdir(folder))
    return names[:n]


def ingest(args) -> dict:
    b = contract.read(args.bundle)
    v, f = b.manifest["vision"], b.manifest["fne"]
    if v.get("tap_point", "post_relu") != "post_relu":
        raise SystemExit("the torch model taps after the ReLU; this bundle taps elsewhere")
    mode = args.crop or v["crop_mode"]
    per = images.N_CROPS[mode]
    graph = b.path("vision.onnx")
    if args.framework == "ort":
        sess = features.session(graph, args.threads)
        run = lambda x: sess.run([v["output_name"]], {v["input_name"]: x})[0]  # noqa: E731
    else:
        import torch

        torch.set_num_threads(args.threads)
        model = torch_model(weights_from_graph(graph))

        def run(x):
            with torch.inference_mode():
                return model(torch.from_numpy(x)).numpy()

    names = image_names(args.images, args.list, args.n)
    files = [(Path(args.images) / n).read_bytes() for n in names]
    w_t = np.ascontiguousarray(b.projection.T)
    per_run = max(args.max_batch_crops // per, 1)
    # Warm-up, every step once, with one full run as the server's bench does (the first graph run of a shape
    # allocates; BLAS starts its threads).
    warm = run(np.concatenate([images.preprocess(d, v, mode) for d in files[:per_run]]))
    fne.encode(warm[:1], b.fne_mean, b.fne_std).astype(np.float32) @ w_t
    st = dict.fromkeys(["decode", "resize_and_crops", "vision", "fne", "projection"], 0.0)
    clock = time.perf_counter
    t_all = clock()
    for s in range(0, len(files), args.batch):
        chunk = files[s:s + args.batch]
        batch = []
        for data in chunk:
            t = clock()
            rgb = images.decode(data)
            st["decode"] += clock() - t
            t = clock()
            batch.append(images.normalise(images.crops(images.resize(rgb, v["resize"]), v["input_size"], mode),
                                          v["color_order"], v["mean"], v["scale"]))
            st["resize_and_crops"] += clock() - t
        t = clock()
        raw = np.concatenate([run(np.concatenate(batch[i:i + per_run])) for i in range(0, len(batch), per_run)])
        st["vision"] += clock() - t
        t = clock()
        codes = fne.encode(raw.reshape(len(chunk), per, -1).mean(axis=1, dtype=np.float32),
                           b.fne_mean, b.fne_std, tuple(f["thresholds"]), f["std_eps"])
        st["fne"] += clock() - t
        t = clock()
        vec = codes.astype(np.float32) @ w_t
        vec /= np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-30)
        st["projection"] += clock() - t
    whole = clock() - t_all
    n = len(files)
    total = sum(st.values())
    return {
        "bench": "python-ingest", "framework": "onnxruntime-python" if args.framework == "ort" else "pytorch-eager",
        "images": n, "crop_mode": mode, "threads": args.threads, "batch": args.batch,
        "max_batch_crops": args.max_batch_crops, "whole_path_s": round(whole, 3),
        "images_per_s": round(n / whole, 3),
        "profile": {k: {"ms_per_image": round(s * 1e3 / n, 2), "share": round(s / total, 4)} for k, s in st.items()},
        "loadavg": loadavg(),
    }


def check(args) -> dict:
    """PyTorch eager and onnxruntime agree on the bundle's graph (the comparison compares the same thing)."""
    import torch

    torch.set_num_threads(args.threads)
    b = contract.read(args.bundle)
    v = b.manifest["vision"]
    names = image_names(args.images, args.list, 2)
    x = np.concatenate([images.preprocess((Path(args.images) / n).read_bytes(), v, "center") for n in names])
    ours = features.session(b.path("vision.onnx"), args.threads).run([v["output_name"]], {v["input_name"]: x})[0]
    with torch.inference_mode():
        theirs = torch_model(weights_from_graph(b.path("vision.onnx")))(torch.from_numpy(x)).numpy()
    rel = float(np.abs(ours - theirs).max() / max(np.abs(ours).max(), 1e-12))
    return {"bench": "python-check", "max_rel_diff_torch_vs_ort": rel, "same": rel < 1e-3}


def ort_matmul(threads: int):
    """A float32 matrix product through ONNX Runtime (MLAS: the kernels the server's convolutions run on, which
    use AVX-512 where the CPU has it, when the BLAS libraries may not)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "sgemm",
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", "N"]) for x in ("a", "b")],
                          [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N", "N"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda x, y: sess.run(None, {"a": x, "b": y})[0]


def sgemm(args) -> dict:
    """GFLOP/s of a large float32 matrix product, best of `reps`, with numpy (OpenBLAS), torch (MKL) and ONNX
    Runtime (MLAS); the best of them stands for the machine's FP32 rate."""
    import torch

    torch.set_num_threads(args.threads)
    n = args.size
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    c = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    out = {}
    for name, mm, x, y in (("numpy_openblas", np.matmul, a, c),
                           ("torch_mkl", torch.mm, torch.from_numpy(a), torch.from_numpy(c)),
                           ("onnxruntime_mlas", ort_matmul(args.threads), a, c)):
        mm(x, y)
        best = float("inf")
        for _ in range(args.reps):
            t = time.perf_counter()
            mm(x, y)
            best = min(best, time.perf_counter() - t)
        out[name] = round(2.0 * n ** 3 / best / 1e9, 1)
    b = contract.read(args.bundle)
    gflop = graph_flops(weights_from_graph(b.path("vision.onnx")), b.manifest["vision"]["input_size"]) / 1e9
    return {"bench": "sgemm", "size": n, "threads": args.threads, "gflops": out,
            "peak_gflops": max(out.values()), "graph_gflop_per_crop": round(gflop, 3), "loadavg": loadavg()}


def report(args) -> str:
    """Markdown tables from scripts/bench.sh's results.jsonl (the numbers docs/benchmarks.md quotes)."""
    rows = [json.loads(x) for x in Path(args.results).read_text().splitlines() if x.strip()]
    out = []
    by = {r.get("label"): r for r in rows}
    ingest = [r for r in rows if r["bench"] in ("ingest", "python-ingest")]
    if ingest:
        out += ["| round | crops | server img/s | onnxruntime-python img/s | PyTorch eager img/s | server / ORT | "
                "server / torch | server vision GFLOP/s | SGEMM GFLOP/s | fraction | load avg |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        flop = next((r["graph_gflop_per_crop"] for r in rows if r["bench"] == "sgemm"), 30.693)
        for label in [r["label"] for r in ingest if r["bench"] == "ingest"]:
            _, _, mode, rnd = label.split("-")
            s_, o_, t_ = (by.get(f"ingest-{w}-{mode}-{rnd}") for w in ("server", "ort", "torch"))
            if not (s_ and o_ and t_):
                continue
            crops = images.N_CROPS[mode]
            gfs = flop * crops / (s_["profile"]["vision"]["ms_per_image"] / 1e3)
            peak = by.get(f"sgemm-{rnd}", {}).get("peak_gflops")
            out.append(f"| {rnd} | {mode} | {s_['images_per_s']:.3f} | {o_['images_per_s']:.3f} | "
                       f"{t_['images_per_s']:.3f} | {s_['images_per_s'] / o_['images_per_s']:.2f}x | "
                       f"{s_['images_per_s'] / t_['images_per_s']:.2f}x | {gfs:.1f} | {peak or '-'} | "
                       f"{f'{gfs / peak:.0%}' if peak else '-'} | {s_['loadavg']} |")
        stages = ["decode", "resize_and_crops", "vision", "fne", "projection", "store", "index"]
        out += ["", "| run (ms per image) | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
        for r in ingest:
            out.append(f"| {r['label']} | " + " | ".join(str(r["profile"].get(st, {}).get("ms_per_image", "-"))
                                                      for st in stages) + " |")
        out.append("")
    loads = [r for r in rows if r["bench"] == "load"]
    if loads:
        out += ["| run | mode | clients / rate | requests | ok/s | p50 ms | p99 ms | max ms | statuses | "
                "p50 by tenth of the run (ms) | load avg |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in loads:
            lat = r["latency_all"] or {}
            who = r["concurrency"] if r["mode"] == "closed" else f"{r['rate']:g}/s"
            out.append(f"| {r['label']} | {r['mode']} | {who} | {r['requests']} | {r['throughput_ok_per_s']} | "
                       f"{lat.get('p50_ms')} | {lat.get('p99_ms')} | {lat.get('max_ms')} | "
                       f"{' '.join(f'{k}:{v}' for k, v in r['statuses'].items())} | "
                       f"{' '.join(str(x) for x in r['p50_ms_by_tenth'])} | {r['loadavg']} |")
        out.append("")
    for r in rows:
        if r["bench"] in ("index", "projection", "start", "seed", "machine", "sgemm", "python-check"):
            out.append(f"- `{r['label']}`: `{json.dumps({k: v for k, v in r.items() if k != 'label'})}`")
    return "\n".join(out)


def text(args) -> dict:
    """ms per sentence (tokenizer call included, one thread) of the bundle's text graph and of the trained graph
    its vocabulary extends: medians of `reps` interleaved rounds of the first `n` test captions one at a time."""
    import statistics

    import onnxruntime as ort

    from ..data import flickr8k
    from ..text import tokenizer

    d = Path(args.bundle)
    t = contract.read(d).manifest["text"]
    if "vocabulary" not in t:
        raise SystemExit(f"{d}: no text.vocabulary to compare with")
    caps = [c for cs in flickr8k.load_split(args.data, "test").captions for c in cs][: args.n]
    forms = {}
    for name, files in (("trained", t["vocabulary"]["from"]), ("whole_vocabulary", t)):
        so = features.options(1)
        so.inter_op_num_threads = 1
        forms[name] = (ort.InferenceSession(str(d / files["onnx"]), so, providers=["CPUExecutionProvider"]),
                       tokenizer.load(d / files["tokenizer"]))
    ms = {k: [] for k in forms}
    for _ in range(args.reps):
        for k, (sess, tok) in forms.items():
            t0 = time.perf_counter()
            for c in caps:
                ids, lengths = tokenizer.encode_batch(tok, [c], t["max_tokens"])
                sess.run([t["output_name"]], {t["ids_name"]: ids, t["lengths_name"]: lengths})
            ms[k].append(1e3 * (time.perf_counter() - t0) / len(caps))
    med = {k: round(statistics.median(v), 3) for k, v in ms.items()}
    return {"bench": "text", "sentences": len(caps), "ms_per_sentence": med, "rounds": ms,
            "ratio": round(med["whole_vocabulary"] / med["trained"], 3), "loadavg": loadavg()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m jointspace_train.evaluation.bench",
                                description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["ingest", "sgemm", "check", "text", "report"])
    p.add_argument("--results", default="../target/bench/results.jsonl", help="report: scripts/bench.sh's output")
    p.add_argument("--bundle", default="models/flickr8k-vgg16-fne")
    p.add_argument("--images", default="/work/shared/data/flickr8k/images")
    p.add_argument("--data", default="/work/shared/data/flickr8k", help="text: where the test captions are")
    p.add_argument("--list", help="image file names, one per line (default: the folder's first n by name)")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--crop", choices=images.CROP_MODES)
    p.add_argument("--framework", choices=["ort", "torch"], default="ort")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="images per batch, as the server's add request")
    p.add_argument("--max-batch-crops", type=int, default=32, help="most crops per graph run, as the server")
    p.add_argument("--size", type=int, default=4096, help="sgemm: matrix side")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    if args.what == "report":
        print(report(args))
        return
    print(json.dumps({"ingest": ingest, "sgemm": sgemm, "check": check, "text": text}[args.what](args), indent=2))


if __name__ == "__main__":
    main()
