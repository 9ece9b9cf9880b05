"""Helpers of scripts/bench-pgvector.sh: the synthetic export, the exact answers, and the recall and latency of
sentence searches against them."""
import base64
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

FILTERS = (
    ("unfiltered", None),
    ("1%", {"bucket": 7}),
    ("5%", {"bucket": {"$in": [0, 1, 2, 3, 4]}}),
    ("10%", {"bucket": {"$in": list(range(10, 20))}}),
    ("50%", {"half": 0}),
)


VALUES = np.array([-1, 0, 0, 1], dtype=np.int8)


def cluster_codes(rng, protos, n, start):
    """The first synthetic set: 1,000 random prototypes, a fifth of each one's positions redrawn per image. At 1M
    its 1,000 near-copies a cluster leave hundreds of codes within rounding of a query's tenth neighbour."""
    dim = protos.shape[1]
    ids = np.arange(start, start + n)
    codes = protos[ids % 1000].copy()
    # dim // 5 distinct positions per row: the smallest of a row of uniform draws.
    pos = np.argpartition(rng.random((n, dim), dtype=np.float32), dim // 5, axis=1)[:, : dim // 5]
    np.put_along_axis(codes, pos, VALUES[rng.integers(0, 4, size=pos.shape)], axis=1)
    return codes


def flickr8k_photos(bundle, data):
    """Flickr8k's photos' ternary codes under the bundle (its vision graph, crop mode and FNE statistics), from the
    trainer's feature cache (computed there, once, when missing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
    from jointspace_train.bundle import pipeline
    from jointspace_train.data import flickr8k
    from jointspace_train.vision import features

    p = pipeline.Pipeline(bundle)
    v = p.m["vision"]
    raw = features.extract(p.bundle.path("vision.onnx"), v, Path(data) / "images", flickr8k.all_images(data),
                           v["crop_mode"])
    return p.codes(raw)


def crossover_codes(rng, photos, n):
    """Real photos' codes re-drawn: each image takes every position from one of two random Flickr8k photos, a
    share of 50-90% from the first, so the vectors spread as photos do (between two real ones, some close to
    one) rather than in tight clusters of near-copies. Also the first photo of each, which the image most
    resembles."""
    first = rng.integers(0, len(photos), size=n)
    a = photos[first]
    b = photos[rng.integers(0, len(photos), size=n)]
    share = rng.uniform(0.5, 0.9, size=(n, 1)).astype(np.float32)
    return np.where(rng.random(a.shape, dtype=np.float32) < share, a, b), first


def export(bundle, n, path, kind, data, titles=False):
    """N synthetic images' codes (KIND: `flickr8k`, re-drawn photos, or `clusters`) as a `jointspace import`
    file; metadata `bucket` (id % 100) and `half` (id % 2) for the filters, and with TITLES (flickr8k) a `title`:
    the first caption of the photo the image mostly takes after, as a shop's product name."""
    with open(f"{bundle}/bundle.json") as f:
        dim = json.load(f)["fne"]["dim"]
    # The vision id as the server computes it is checked on import: read it from the server's own reading.
    text = subprocess.run(["target/release/jointspace", "bundle", "inspect", bundle],
                          capture_output=True, text=True, check=True).stdout
    bundle_id = text.split("bundle", 1)[1].split()[0]
    vision_id = text.split("vision id", 1)[1].split()[0]
    rng = np.random.default_rng(44)
    photos = flickr8k_photos(bundle, data) if kind == "flickr8k" else None
    names = None
    if titles:
        from jointspace_train.data import flickr8k

        captions = flickr8k.load_captions(data)
        names = [captions[f][0] for f in flickr8k.all_images(data)]
    protos = VALUES[rng.integers(0, 4, size=(1000, dim))] if photos is None else None
    header = {"format": "jointspace-export", "version": 1, "collection": "big", "description": f"synthetic ({kind})",
              "exported_at": "2026-11-26T00:00:00Z"}
    if names is not None:
        header["text_fields"] = ["title"]
    with open(path, "w") as f:
        f.write(json.dumps({"header": header}) + "\n")
        chunk = 2000
        for start in range(0, n, chunk):
            m = min(n, start + chunk) - start
            if photos is None:
                codes, first = cluster_codes(rng, protos, m, start), None
            else:
                codes, first = crossover_codes(rng, photos, m)
            plus = np.packbits(codes == 1, axis=1, bitorder="little")
            minus = np.packbits(codes == -1, axis=1, bitorder="little")
            for j, (i, p, q) in enumerate(zip(range(start, start + m), plus, minus)):
                code = base64.b64encode(p.tobytes() + q.tobytes()).decode()
                meta = {"bucket": i % 100, "half": i % 2}
                if names is not None:
                    meta["title"] = names[first[j]]
                f.write(json.dumps({"image": {"external_id": f"s{i}", "metadata": meta,
                                              "width": 64, "height": 64, "code": code, "vision_id": vision_id,
                                              "bundle_id": bundle_id, "created_at": "2026-11-26T00:00:00Z"}}) + "\n")
        f.write(json.dumps({"end": {"images": n, "captions": 0}}) + "\n")


def search(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/collections/big/images/search",
                                 data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    r = json.load(urllib.request.urlopen(req))
    return [(h["image"]["id"], h["score"]) for h in r["results"]], time.perf_counter() - t


def queries():
    words = ["dog", "man", "woman", "child", "beach", "grass", "water", "snow", "street", "ball", "bike", "red",
             "black", "white", "running", "jumping", "sitting", "two", "girl", "boy", "city", "mountain", "river",
             "car", "building"]
    rng = random.Random(7)
    sentences = [" ".join(["a"] + rng.sample(words, 3)) for _ in range(100)]
    for name, flt in FILTERS:
        for s in sentences:
            body = {"text": s, "k": 10, "mode": "vector"}
            if flt:
                body["filter"] = flt
            yield name, body


def truth(exact, path):
    """The exact server's answers, one JSON line per query, for `searches` to score against."""
    with open(path, "w") as f:
        for name, body in queries():
            f.write(json.dumps({"filter": name, "body": body, "hits": search(exact, body)[0]}) + "\n")


def searches(n, truth_path, ports):
    """Recall@10 against the exact answers and sequential latency, per filter and server (MODE=PORT ...)."""
    with open(truth_path) as f:
        want = [json.loads(line) for line in f]
    for name, _ in FILTERS:
        out = {"bench": "pgvector-search", "n": n, "filter": name}
        lat = {mode: [] for mode in ports}
        rec = {mode: 0 for mode in ports}
        total = 0
        for w in (w for w in want if w["filter"] == name):
            cut = w["hits"][-1][1] - 1e-6
            ids = {h[0] for h in w["hits"]}
            total += len(w["hits"])
            for mode, port in ports.items():
                got, dt = search(port, w["body"])
                lat[mode].append(dt)
                rec[mode] += sum(1 for h in got if h[0] in ids or h[1] >= cut)
        for mode, times in lat.items():
            xs = sorted(times)
            out[f"{mode}_recall_at_10"] = round(rec[mode] / total, 4)
            out[f"{mode}_p50_ms"] = round(1e3 * xs[len(xs) // 2], 1)
            out[f"{mode}_p99_ms"] = round(1e3 * xs[int(len(xs) * 0.99) - 1], 1)
        print(json.dumps(out), flush=True)


def titled(n, titles_path, data, ports):
    """Keyword and hybrid quality on the titled set (TITLES=1): 400 random Flickr8k photos, their second and third
    captions as queries, each right when an image titled with the photo's first caption comes first (R@1) or in
    the top 10; sequential latency alongside. TITLES_PATH: `id<TAB>title` lines of the collection's images."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "train"))
    from jointspace_train.data import flickr8k

    captions = flickr8k.load_captions(data)
    by_title = {}
    with open(titles_path) as f:
        for line in f:
            i, t = line.rstrip("\n").split("\t", 1)
            by_title.setdefault(t, set()).add(int(i))
    sample = random.Random(5).sample(flickr8k.all_images(data), 400)
    for mode in ("keyword", "hybrid"):
        out = {"bench": "pgvector-titled-quality", "n": n, "mode": mode}
        for server, port in ports.items():
            first = top = 0
            lat = []
            for p in sample:
                right = by_title.get(captions[p][0])
                for q in captions[p][1:3] if right else []:
                    got, dt = search(port, {"text": q, "k": 10, "mode": mode})
                    ids = [g[0] for g in got]
                    lat.append(dt)
                    first += bool(ids) and ids[0] in right
                    top += any(i in right for i in ids)
            xs = sorted(lat)
            out[f"{server}_queries"] = len(xs)
            out[f"{server}_r1"] = round(100 * first / len(xs), 2)
            out[f"{server}_r10"] = round(100 * top / len(xs), 2)
            out[f"{server}_p50_ms"] = round(1e3 * xs[len(xs) // 2], 1)
            out[f"{server}_p99_ms"] = round(1e3 * xs[int(len(xs) * 0.99) - 1], 1)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7:] == ["titles"])
    elif sys.argv[1] == "truth":
        truth(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1] == "titled":
        titled(int(sys.argv[2]), sys.argv[3], sys.argv[4], dict(a.split("=") for a in sys.argv[5:]))
    else:
        searches(int(sys.argv[2]), sys.argv[3], dict(a.split("=") for a in sys.argv[4:]))
