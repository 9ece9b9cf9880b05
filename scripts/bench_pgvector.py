"""Helpers of scripts/bench-pgvector.sh: the synthetic export, and the recall and latency of sentence searches."""
import base64
import json
import random
import sys
import time
import urllib.request


def export(bundle, n, path):
    with open(f"{bundle}/bundle.json") as f:
        m = json.load(f)
    dim = m["fne"]["dim"]
    # The vision id as the server computes it is checked on import: read it from the server's own reading.
    import subprocess
    text = subprocess.run(["target/release/jointspace", "bundle", "inspect", bundle],
                          capture_output=True, text=True, check=True).stdout
    bundle_id = text.split("bundle", 1)[1].split()[0]
    vision_id = text.split("vision id", 1)[1].split()[0]
    rng = random.Random(44)
    clusters = 1000
    protos = [[rng.choice((-1, 0, 0, 1)) for _ in range(dim)] for _ in range(clusters)]
    plane = (dim + 7) // 8
    with open(path, "w") as f:
        f.write(json.dumps({"header": {"format": "jointspace-export", "version": 1, "collection": "big",
                                       "description": "synthetic", "exported_at": "2026-11-26T00:00:00Z"}}) + "\n")
        for i in range(n):
            code = list(protos[i % clusters])
            for j in rng.sample(range(dim), dim // 5):
                code[j] = rng.choice((-1, 0, 0, 1))
            packed = bytearray(2 * plane)
            for j, v in enumerate(code):
                if v == 1:
                    packed[j // 8] |= 1 << (j % 8)
                elif v == -1:
                    packed[plane + j // 8] |= 1 << (j % 8)
            f.write(json.dumps({"image": {"external_id": f"s{i}", "metadata": {"bucket": i % 100, "half": i % 2},
                                          "width": 64, "height": 64, "code": base64.b64encode(packed).decode(),
                                          "vision_id": vision_id, "bundle_id": bundle_id,
                                          "created_at": "2026-11-26T00:00:00Z"}}) + "\n")
        f.write(json.dumps({"end": {"images": n, "captions": 0}}) + "\n")


def search(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/collections/big/images/search",
                                 data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    r = json.load(urllib.request.urlopen(req))
    return [(h["image"]["id"], h["score"]) for h in r["results"]], time.perf_counter() - t


def searches(n, db, mem, exact):
    words = ["dog", "man", "woman", "child", "beach", "grass", "water", "snow", "street", "ball", "bike", "red", "black", "white", "running", "jumping", "sitting", "two", "girl", "boy", "city", "mountain", "river", "car", "building"]
    rng = random.Random(7)
    sentences = [" ".join(["a"] + rng.sample(words, 3)) for _ in range(100)]
    for name, flt in (("unfiltered", None), ("1%", {"bucket": 7}), ("50%", {"half": 0})):
        out = {"bench": "pgvector-search", "n": n, "filter": name}
        lat = {"database": [], "memory": []}
        rec = {"database": 0, "memory": 0}
        total = 0
        for s in sentences:
            body = {"text": s, "k": 10, "mode": "vector"}
            if flt:
                body["filter"] = flt
            want, _ = search(exact, body)
            cut = want[-1][1] - 1e-6
            ids = {h[0] for h in want}
            total += len(want)
            for mode, port in (("database", db), ("memory", mem)):
                got, dt = search(port, body)
                lat[mode].append(dt)
                rec[mode] += sum(1 for h in got if h[0] in ids or h[1] >= cut)
        for mode, times in lat.items():
            xs = sorted(times)
            out[f"{mode}_recall_at_10"] = round(rec[mode] / total, 4)
            out[f"{mode}_p50_ms"] = round(1e3 * xs[len(xs) // 2], 1)
            out[f"{mode}_p99_ms"] = round(1e3 * xs[int(len(xs) * 0.99) - 1], 1)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        searches(int(sys.argv[2]), *map(int, sys.argv[3:6]))
