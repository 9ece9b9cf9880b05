"""Soak load for scripts/soak.sh: ingest and search threads against a running server, RSS sampled from /proc."""

import base64
import http.client
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

base, pid = sys.argv[1], int(sys.argv[2])
seconds = int(os.environ.get("SOAK_SECONDS", "600"))
growth_mb = float(os.environ.get("SOAK_RSS_GROWTH_MB", "64"))
data = os.environ.get("SOAK_DATA", "../shared/data/flickr8k")
warmup = min(60, seconds // 5)

caps = {}
with open(os.path.join(data, "Flickr8k.token.txt"), encoding="utf-8") as f:
    for line in f:
        name, text = line.rstrip("\n").split("\t", 1)
        caps.setdefault(name.split("#")[0], []).append(text)
names = sorted(caps)
random.seed(0)

lock = threading.Lock()
counts = {"ingest_ok": 0, "search_ok": 0, "collections": 0, "shed_429": 0, "errors": 0}
errors = []
stop = time.monotonic() + seconds


def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method)
    if body is not None:
        req.data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:300]
    except (OSError, ValueError, http.client.HTTPException) as e:  # connection failures count as errors
        return 0, repr(e)


def check(what, status, body, ok=(200, 201, 204)):
    with lock:
        if status in ok:
            return True
        if status == 429:
            counts["shed_429"] += 1
            return False
        counts["errors"] += 1
        errors.append(f"{what}: {status} {body!r}"[:400])
        return False


def image_item(name):
    with open(os.path.join(data, "images", name), "rb") as f:
        return {"data": base64.b64encode(f.read()).decode(), "external_id": name, "captions": caps[name][:2]}


def ingest(names_, coll):
    for i in range(0, len(names_), 4):
        s, b = call("POST", f"/v1/collections/{coll}/images", {"images": [image_item(n) for n in names_[i:i + 4]]})
        if check("ingest", s, b):
            with lock:
                counts["ingest_ok"] += len(names_[i:i + 4])


def cycle_worker(wid):
    """Create a collection, fill it, search it, delete it: the data held stays bounded."""
    k = 0
    while time.monotonic() < stop:
        coll = f"soak-{wid}-{k}"
        k += 1
        if not check("create", *call("POST", "/v1/collections", {"name": coll})):
            continue
        ingest(random.sample(names, 24), coll)
        check("search", *call("POST", f"/v1/collections/{coll}/images/search", {"text": random.choice(caps[random.choice(names)]), "k": 5}))
        check("delete", *call("DELETE", f"/v1/collections/{coll}"))
        with lock:
            counts["collections"] += 1


def search_worker():
    while time.monotonic() < stop:
        q = random.choice(caps[random.choice(names)])
        kind = random.choice(["images", "captions"])
        s, b = call("POST", f"/v1/collections/base/{kind}/search", {"text": q, "k": 10})
        if check("search", s, b):
            with lock:
                counts["search_ok"] += 1


def rss_mb():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


check("create base", *call("POST", "/v1/collections", {"name": "base"}))
ingest(names[:64], "base")
print(f"soak: base collection ready (64 images); {seconds}s of load from now, RSS {rss_mb():.0f} MB", flush=True)
stop = time.monotonic() + seconds
threads = [threading.Thread(target=cycle_worker, args=(w,)) for w in range(2)]
threads += [threading.Thread(target=search_worker) for _ in range(2)]
for t in threads:
    t.start()
t0, samples = time.monotonic(), []
while any(t.is_alive() for t in threads):
    samples.append((time.monotonic() - t0, rss_mb()))
    with lock:
        c = dict(counts)
    print(f"soak: t={samples[-1][0]:5.0f}s rss={samples[-1][1]:7.1f} MB {c}", flush=True)
    time.sleep(10)
for t in threads:
    t.join()
after = [r for (t, r) in samples if t >= warmup]
start, end, peak = after[0], samples[-1][1], max(r for _, r in samples)
print(f"soak: RSS after {warmup}s warm-up {start:.1f} MB, end {end:.1f} MB, max {peak:.1f} MB, "
      f"{len(samples)} samples; {counts}")
fail = False
if counts["errors"]:
    print("soak: FAIL: errors:", *errors[:10], sep="\n  ")
    fail = True
if end - start > growth_mb:
    print(f"soak: FAIL: RSS grew {end - start:.1f} MB after warm-up (limit {growth_mb} MB)")
    fail = True
print("soak: FAIL" if fail else "soak: PASS")
sys.exit(1 if fail else 0)
