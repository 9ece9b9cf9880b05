"""Soak load for scripts/soak.sh: ingest, delete and search threads against one or more running servers sharing a
database, their memory sampled from /proc every second, the database's size every 10 s; at the end the verdicts of
scripts/soak_trend.py (memory and p99 trends) and the ledger (rows in the database against acknowledged writes).

    python3 scripts/soak.py DB URL=PID [URL=PID ...]
      DB: sqlite:PATH (the SQLite file) or postgres:PSQL|CONNINFO (the psql program, and what it connects with)

The load, spread over the servers in turn:
  - 2 cycle threads: create a collection, add 24 photos with 2 captions each (4 a request), search it, check its
    count against the photos acknowledged, delete it: the data held stays bounded, so a climb means a leak;
  - 2 search threads: sentence searches of a fixed 64-photo collection `base` (images and captions), their latency
    per window is the p99 that must not climb;
  - 1 ledger thread: one photo a request, each with its own external id, into a collection `ledger` kept at
    SOAK_LEDGER_SIZE photos by deleting the oldest acknowledged one. At the end the external ids in the database
    must be exactly those acknowledged added and not acknowledged deleted (nothing lost, nothing doubled), and each
    server's count must agree.
Settings (environment): SOAK_SECONDS (600), SOAK_DATA (Flickr8k: Flickr8k.token.txt and images/; or any folder of
photos, captions made up), SOAK_OUT (where samples.jsonl, latency.jsonl, report.json, rss.png, p99.png go), SOAK_MODE (a label),
SOAK_WARMUP_SECONDS, SOAK_WINDOW_SECONDS, SOAK_RSS_SLOPE_MB_PER_HOUR (50), SOAK_RSS_NOISE_MB (16),
SOAK_P99_SLOPE_PCT_PER_HOUR (50), SOAK_P99_NOISE_MS (10), SOAK_LEDGER_SIZE (200).
"""

import base64
import http.client
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_trend as st  # noqa: E402


def env_f(name, default):
    return float(os.environ.get(name) or default)


db_spec = sys.argv[1]
servers = [(u, int(p)) for u, p in (a.rsplit("=", 1) for a in sys.argv[2:])]
seconds = int(env_f("SOAK_SECONDS", 600))
warmup = env_f("SOAK_WARMUP_SECONDS", min(300, max(20, seconds // 5)))
width = env_f("SOAK_WINDOW_SECONDS", min(60, max(10, seconds // 10)))
rss_slope, rss_noise = env_f("SOAK_RSS_SLOPE_MB_PER_HOUR", 50), env_f("SOAK_RSS_NOISE_MB", 16)
p99_slope, p99_noise = env_f("SOAK_P99_SLOPE_PCT_PER_HOUR", 50), env_f("SOAK_P99_NOISE_MS", 10)
ledger_size = int(env_f("SOAK_LEDGER_SIZE", 200))
mode = os.environ.get("SOAK_MODE", "sqlite")
data = os.environ.get("SOAK_DATA", "tests/fixtures/images")  # soak.sh sets it (Flickr8k where it is there)
out_dir = os.environ.get("SOAK_OUT", "target/soak")
os.makedirs(out_dir, exist_ok=True)

# The photos and their captions: Flickr8k's, or any folder of photos with made-up captions.
caps = {}
token = os.path.join(data, "Flickr8k.token.txt")
if os.path.exists(token):
    photo_dir = os.path.join(data, "images")
    with open(token, encoding="utf-8") as f:
        for line in f:
            name, text = line.rstrip("\n").split("\t", 1)
            caps.setdefault(name.split("#")[0], []).append(text)
else:
    photo_dir = data
    words = ["a dog runs on the grass", "two people walk along a beach", "a child plays with a red ball",
             "a man rides a bike down the street", "a black and white cat sleeps", "people stand in the snow"]
    for i, name in enumerate(sorted(n for n in os.listdir(data) if n.lower().endswith((".png", ".jpg", ".jpeg")))):
        caps[name] = [words[i % len(words)], words[(i + 3) % len(words)]]
# Flickr8k's token file names a photo that is not among its images ("2258277193_586949ec62.jpg.1").
names = sorted(n for n in caps if os.path.exists(os.path.join(photo_dir, n)))
photos = {}
random.seed(0)

lock = threading.Lock()
counts = {"searches": 0, "ingested": 0, "ingest_requests": 0, "ledger_added": 0, "ledger_deleted": 0,
          "collections_cycled": 0, "shed_429": 0,
          "retried_503_not_loaded": 0, "errors": 0}
errors = []
latencies = []  # (t since start, ms, server)
t_start = time.monotonic()
stop = t_start + 1e9


def photo_b64(name):
    if name not in photos:
        with open(os.path.join(photo_dir, name), "rb") as f:
            photos[name] = base64.b64encode(f.read()).decode()
    return photos[name]


NOT_LOADED = b"index is not loaded yet"


def call(server, method, path, body=None):
    """One request; a write refused with 503 because this replica has not yet followed the collection's creation
    (nothing was stored: the service checks before it writes) is sent again after its Retry-After, as a client
    should, up to 20 times, and counted."""
    for _ in range(20):
        status, b = call_once(server, method, path, body)
        if not (status == 503 and isinstance(b, bytes) and NOT_LOADED in b):
            break
        with lock:
            counts["retried_503_not_loaded"] += 1
        time.sleep(1)
    return status, b


def call_once(server, method, path, body=None):
    req = urllib.request.Request(servers[server % len(servers)][0] + path, method=method)
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


def item(name, ext):
    return {"data": photo_b64(name), "external_id": ext, "captions": caps[name][:2]}


def ingest(server, coll, items):
    """Adds items 4 a request; returns how many were acknowledged."""
    acked = 0
    for i in range(0, len(items), 4):
        batch = items[i:i + 4]
        s, b = call(server + i // 4, "POST", f"/v1/collections/{coll}/images", {"images": batch})
        with lock:
            counts["ingest_requests"] += 1
        if check(f"ingest {coll}", s, b):
            acked += len(batch)
            with lock:
                counts["ingested"] += len(batch)
    return acked


def guarded(worker):
    """A worker whose death is an error of the run: a load that silently stops would pass as a quiet one."""
    def run(*args):
        try:
            worker(*args)
        except Exception as e:  # any failure of the load is the run's failure
            with lock:
                counts["errors"] += 1
                errors.append(f"{worker.__name__} died: {e!r}"[:400])
            raise
    return run


def cycle_worker(wid):
    """Create a collection, fill it, search it, check its count, delete it: the data held stays bounded."""
    k = 0
    while time.monotonic() < stop:
        coll, server = f"soak-{wid}-{k}", k
        k += 1
        if not check("create", *call(server, "POST", "/v1/collections", {"name": coll})):
            continue
        picks = [random.choice(names) for _ in range(24)]
        acked = ingest(server + 1, coll, [item(n, f"{i}-{n}") for i, n in enumerate(picks)])
        q = random.choice(caps[random.choice(names)])
        check("search", *call(server, "POST", f"/v1/collections/{coll}/images/search", {"text": q, "k": 5}))
        s, b = call(server, "GET", f"/v1/collections/{coll}")
        if check("count", s, b) and b["images"] != acked:
            check(f"count {coll}: {b['images']} images stored, {acked} acknowledged", -1, "")
        check("delete", *call(server + 1, "DELETE", f"/v1/collections/{coll}"))
        with lock:
            counts["collections_cycled"] += 1


def search_worker(wid):
    k = wid
    while time.monotonic() < stop:
        k += 1
        q = random.choice(caps[random.choice(names)])
        kind = random.choice(["images", "captions"])
        t0 = time.monotonic()
        s, b = call(k, "POST", f"/v1/collections/base/{kind}/search", {"text": q, "k": 10})
        t1 = time.monotonic()
        if check("search", s, b):
            with lock:
                counts["searches"] += 1
                latencies.append((t1 - t_start, (t1 - t0) * 1000, k % len(servers)))


ledger = {}  # external id -> image id, acknowledged added and not (yet) acknowledged deleted
ledger_order = []
uncertain = set()  # writes whose outcome is unknown (no answer): allowed either way at the end


def ledger_add(server, *seqs):
    exts = [f"ledger-{seq}" for seq in seqs]
    batch = [item(names[seq % len(names)], ext) for seq, ext in zip(seqs, exts)]
    s, b = call(server, "POST", "/v1/collections/ledger/images", {"images": batch})
    if s == 0:
        uncertain.update(exts)
    if check("ledger add", s, b):
        for added in sorted(b["images"], key=lambda a: a["index"]):
            ledger[exts[added["index"]]] = added["id"]
            ledger_order.append(exts[added["index"]])
        with lock:
            counts["ledger_added"] += len(exts)


def ledger_worker():
    seq = ledger_size  # the ids after the warm-up's
    while time.monotonic() < stop:
        ledger_add(seq, seq)
        seq += 1
        while len(ledger_order) > ledger_size and time.monotonic() < stop:
            ext = ledger_order[0]
            s, b = call(seq, "DELETE", f"/v1/collections/ledger/images/{ledger[ext]}")
            if s == 0:
                uncertain.add(ext)
            if check(f"ledger delete {ext}", s, b):
                with lock:
                    counts["ledger_deleted"] += 1
            elif s == 429 or s == 0:
                time.sleep(0.2)
                continue
            # Deleted, or not found (an error already counted: an acknowledged photo lost): next one.
            ledger_order.pop(0)
            del ledger[ext]


# --- the database -------------------------------------------------------------------------------------------------

def sql(query):
    """Rows of a query on the servers' database, each a tuple of strings."""
    kind, arg = db_spec.split(":", 1)
    if kind == "sqlite":
        con = sqlite3.connect(f"file:{arg}?mode=ro", uri=True, timeout=30)
        try:
            return [tuple(str(v) for v in r) for r in con.execute(query).fetchall()]
        finally:
            con.close()
    psql, conninfo = arg.split("|", 1)
    r = subprocess.run([psql, "-qtAX", "-F", "\t", "-v", "ON_ERROR_STOP=1", conninfo, "-c", query],
                       capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise RuntimeError(f"psql: {r.stderr.strip()}")
    return [tuple(line.split("\t")) for line in r.stdout.splitlines() if line]


def db_bytes():
    kind, arg = db_spec.split(":", 1)
    if kind == "sqlite":
        return sum(os.path.getsize(arg + s) for s in ("", "-wal", "-shm") if os.path.exists(arg + s))
    return int(sql("SELECT pg_database_size(current_database())")[0][0])


# --- sampling ------------------------------------------------------------------------------------------------------

def proc_status(pid):
    """VmRSS, RssAnon, RssFile, VmHWM of a process, MB; and its CPU seconds."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[k] = int(v.split()[0]) / 1024
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return out


def main():
    global stop, t_start
    check("create base", *call(0, "POST", "/v1/collections", {"name": "base"}))
    ingest(0, "base", [item(names[i % len(names)], f"base-{i}") for i in range(64)])
    check("create ledger", *call(0, "POST", "/v1/collections", {"name": "ledger"}))
    for seq in range(0, ledger_size, 4):
        ledger_add(seq // 4, *range(seq, min(seq + 4, ledger_size)))
    db_start = db_bytes()
    print(f"soak: {mode}, {len(servers)} server(s); base (64 photos) and ledger ({len(ledger)}) ready; "
          f"{seconds}s of load from now; warm-up {warmup:g}s, windows of {width:g}s; database {db_start / 1e6:.1f} MB",
          flush=True)
    with lock:
        for k in counts:
            counts[k] = 0
    t_start = time.monotonic()
    stop = t_start + seconds
    threads = [threading.Thread(target=guarded(cycle_worker), args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=guarded(search_worker), args=(w,)) for w in range(2)]
    threads.append(threading.Thread(target=guarded(ledger_worker)))
    for t in threads:
        t.start()
    samples = []  # (t, server, status dict)
    db_sizes = []  # (t, bytes)
    loads = []
    next_print = 0.0
    with open(os.path.join(out_dir, "samples.jsonl"), "w") as log:
        while any(t.is_alive() for t in threads):
            now = time.monotonic() - t_start
            for i, (_, pid) in enumerate(servers):
                s = proc_status(pid)
                if "VmRSS" in s:
                    samples.append((now, i, s))
                    log.write(json.dumps({"t": round(now, 2), "server": i, **s}) + "\n")
            if now >= next_print:
                next_print += 10
                try:
                    db_sizes.append((now, db_bytes()))
                except (RuntimeError, OSError, sqlite3.Error, subprocess.TimeoutExpired) as e:
                    print(f"soak: database size: {e}", flush=True)
                with open("/proc/loadavg") as f:
                    loads.append((now, float(f.read().split()[0])))
                with lock:
                    c = dict(counts)
                rss = " ".join(f"{s['VmRSS']:.0f}" for _, i, s in samples[-len(servers):])
                print(f"soak: t={now:5.0f}s rss={rss} MB db={db_sizes[-1][1] / 1e6 if db_sizes else 0:.1f} MB "
                      f"load={loads[-1][1]:.1f} {c}", flush=True)
            time.sleep(max(0.0, 1 - (time.monotonic() - t_start - now)))
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t_start
    report = {"mode": mode, "servers": len(servers), "seconds": seconds, "elapsed_s": round(elapsed, 1),
              "warmup_s": warmup, "window_s": width, "counts": dict(counts), "errors": errors[:20]}
    fail = []
    if counts["errors"]:
        fail.append(f"{counts['errors']} errors: " + "; ".join(errors[:5]))

    # Memory: per server, the envelopes' trends.
    report["memory"] = []
    rss_series = []
    for i in range(len(servers)):
        s = [(t, d["VmRSS"]) for t, j, d in samples if j == i]
        v = st.memory_verdict(s, warmup, width, rss_slope, rss_noise)
        last = [d for t, j, d in samples if j == i][-1]
        after = [d for t, j, d in samples if j == i and t >= warmup]
        m = {"server": i + 1, "lower": v["lower"], "upper": v["upper"], "lows": v["lows"], "highs": v["highs"],
             "rss_min_mb": min(r for _, r in s), "rss_max_mb": max(r for _, r in s),
             "rss_anon_mb_first_last": [round(after[0].get("RssAnon", 0), 1), round(last.get("RssAnon", 0), 1)] if after else None,
             "rss_file_mb_last": round(last.get("RssFile", 0), 1), "vm_hwm_mb": round(last.get("VmHWM", 0), 1),
             "cpu_s": round(last.get("cpu_s", 0) - samples[0][2].get("cpu_s", 0), 1)}
        report["memory"].append(m)
        for side in ("lower", "upper"):
            d = v[side]
            print(f"soak: server {i + 1} RSS {side} envelope ({d['n']} windows of {width:g}s after {warmup:g}s): "
                  + (f"{d['slope']:+.1f} MB/h (99.5% bounds {d['lower']:+.1f} .. {d['upper']:+.1f}), limit "
                     f"{rss_slope:g} MB/h, climb {d['climb']:+.1f} MB against a margin of {d['margin']:.1f} MB"
                     if d["slope"] is not None else "not judged")
                  + (f": {d['why']}" if d["why"] else ""))
        print(f"soak: server {i + 1} RSS {m['rss_min_mb']:.0f}-{m['rss_max_mb']:.0f} MB; window lows "
              f"{', '.join(f'{x:.0f}' for x in v['lows'])}; highs {', '.join(f'{x:.0f}' for x in v['highs'])}; "
              f"RssAnon {m['rss_anon_mb_first_last']} MB (first after warm-up, last), RssFile {m['rss_file_mb_last']} "
              f"MB, peak (VmHWM) {m['vm_hwm_mb']} MB, {m['cpu_s']} CPU s")
        if v["fail"]:
            fail.append(f"server {i + 1} memory climbs: " + "; ".join(
                f"{side} envelope {v[side]['why']}" for side in ("lower", "upper") if v[side]["fail"]))
        rss_series.append((s, v))

    # Latency: per-window p99 of the base searches, all servers together.
    ev = [(t, ms) for t, ms, _ in latencies]
    with open(os.path.join(out_dir, "latency.jsonl"), "w") as f:
        f.writelines(json.dumps({"t": round(t, 3), "ms": round(ms, 2), "server": i}) + "\n" for t, ms, i in latencies)
    lv = st.p99_verdict(ev, warmup, width, p99_slope, p99_noise)
    d = lv["p99"]
    report["latency"] = {"p99": d, "windows": [{"t": round(t), "n": n, "p50_ms": round(a, 1), "p99_ms": round(b, 1)}
                                               for t, n, a, b in lv["windows"]],
                         "all_p50_ms": st.percentile([x for _, x in ev], 50),
                         "all_p99_ms": st.percentile([x for _, x in ev], 99)}
    print(f"soak: search p99 per window ({d['n']} windows): "
          + ", ".join(f"{w[3]:.0f}" for w in lv["windows"]) + " ms; "
          + (f"trend {d['slope']:+.1f} ms/h (99.5% bounds {d['lower']:+.1f} .. {d['upper']:+.1f}), limit "
             f"{d['limit']:.1f} ms/h ({p99_slope:g}% of the median p99 {d['median_p99']:.1f} ms an hour)"
             if d["slope"] is not None else "not judged")
          + (f": {d['why']}" if d["why"] else ""))
    if lv["fail"]:
        fail.append(f"search p99 climbs: {d['why']}")

    # Nothing lost, nothing doubled: the ledger in the database against the acknowledged writes.
    rows = sql("SELECT i.external_id FROM images i JOIN collections c ON c.id = i.collection_id "
               "WHERE c.name = 'ledger'")
    stored = [r[0] for r in rows]
    doubled = sorted({e for e in stored if stored.count(e) > 1}) if len(stored) != len(set(stored)) else []
    lost = sorted(set(ledger) - set(stored) - uncertain)
    extra = sorted(set(stored) - set(ledger) - uncertain)
    caps_stored = int(sql("SELECT count(*) FROM captions p JOIN collections c ON c.id = p.collection_id "
                          "WHERE c.name = 'ledger'")[0][0])
    left = int(sql("SELECT count(*) FROM collections WHERE name LIKE 'soak-%'")[0][0])
    # Each server's index must hold exactly the rows: a search for all of them (an exact scan: the ledger is smaller
    # than --exact-below) finds every stored photo and no other. Replicas follow the change sequence: time to catch up.
    counts_api, in_index = [], []
    deadline = time.monotonic() + 30
    for i in range(len(servers)):
        while True:
            s, b = call(i, "GET", "/v1/collections/ledger")
            n = b["images"] if s == 200 else None
            s, b = call(i, "POST", "/v1/collections/ledger/images/search", {"text": caps[names[0]][0], "k": 1000})
            found = sorted(r["image"].get("external_id") or "" for r in b["results"]) if s == 200 else None
            if (n == len(stored) and found == sorted(stored)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        counts_api.append(n)
        in_index.append(found == sorted(stored))
    report["ledger"] = {"acknowledged_live": len(ledger), "rows": len(stored), "distinct": len(set(stored)),
                        "captions": caps_stored, "lost": lost[:20], "doubled": doubled[:20], "unacknowledged": extra[:20],
                        "uncertain": len(uncertain), "api_counts": counts_api, "index_matches": in_index, "cycle_collections_left": left}
    print(f"soak: ledger: {counts['ledger_added']} adds and {counts['ledger_deleted']} deletes acknowledged in the run; "
          f"{len(ledger)} photos should be there, the database holds {len(stored)} ({len(set(stored))} distinct) "
          f"with {caps_stored} captions; the servers count {counts_api}, their indexes find exactly those: {in_index}; lost {len(lost)}, doubled {len(doubled)}, "
          f"not acknowledged {len(extra)}, unknown outcome {len(uncertain)}; cycle collections left {left}")
    if lost or doubled or extra:
        fail.append(f"ledger: lost {lost[:5]}, doubled {doubled[:5]}, not acknowledged {extra[:5]}")
    if caps_stored != 2 * len(stored):
        fail.append(f"ledger: {caps_stored} captions for {len(stored)} photos (2 each)")
    if any(n != len(stored) for n in counts_api):
        fail.append(f"ledger: the servers count {counts_api}, the database holds {len(stored)}")
    if not all(in_index):
        fail.append(f"ledger: a search of all of it does not find exactly the stored photos on every server: {in_index}")
    if left:
        fail.append(f"{left} cycle collections left behind")

    db_end = db_bytes()
    report["database_bytes"] = {"start": db_start, "end": db_end}
    print(f"soak: database {db_start / 1e6:.1f} MB at the start of the load, {db_end / 1e6:.1f} MB at the end")
    report["counts"] = dict(counts)
    per_s = {k: round(v / elapsed, 2) for k, v in counts.items() if k in ("searches", "ingested", "ledger_added")}
    print(f"soak: {counts} in {elapsed:.0f}s; per second {per_s}")

    # Plots.
    series = []
    for i, (s, v) in enumerate(rss_series):
        tag = f"S{i + 1} " if len(servers) > 1 else ""
        series.append((f"{tag}RSS", s, "line"))
        series.append((f"{tag}MIN", list(zip(v["windows"], v["lows"])), "dots"))
        series.append((f"{tag}MAX", list(zip(v["windows"], v["highs"])), "dots"))
    st.png_plot(os.path.join(out_dir, "rss.png"), f"{mode.upper()}: RSS MB", series, y_label="MB")
    ws = lv["windows"] or st.latency_windows(ev, 0, width)
    st.png_plot(os.path.join(out_dir, "p99.png"), f"{mode.upper()}: SEARCH MS PER {width:g} S",
                [("P99", [(w[0], w[3]) for w in ws], "line"), ("P50", [(w[0], w[2]) for w in ws], "line")],
                y_label="MS")
    report["fail"] = fail
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"soak: report, samples and plots in {out_dir}")
    for why in fail:
        print(f"soak: FAIL: {why}")
    print("soak: FAIL" if fail else "soak: PASS")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
