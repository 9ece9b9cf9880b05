#!/usr/bin/env python3
"""The client side of scripts/gpu-check.sh, against a running `jointspace serve`.

    embed   the photos' codes and vectors through POST /v1/embed/image (the CPU reference, made by gpu-prepare.sh)
    parity  the same photos again, compared with a reference: ternary features that changed, vectors' cosine
    ingest  photos posted in batches by concurrent clients for a fixed time, after a warm-up: photos/s
    report  the check's results (JSON lines) as one JSON summary and the markdown tables for docs/benchmarks.md

Standard library only: it runs with the GPU machine's python3 (3.12) as with this project's .venv (3.11).
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import math
import multiprocessing
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from pathlib import Path


def request(url: str, body: dict | None = None, timeout: float = 600) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def photos_of(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    names = [n for n in Path(args.list).read_text().split() if n]
    if args.n:
        names = names[: args.n]
    if not names:
        sys.exit(f"{args.list}: no photo names")
    return [(n, (Path(args.photos) / n).read_bytes()) for n in names]


def embed_all(url: str, photos: list[tuple[str, bytes]]) -> tuple[dict, float]:
    """Each photo alone (one request at a time), so a photo's crops form one runtime call on either side."""
    out, t0 = {}, time.perf_counter()
    for name, data in photos:
        status, body = request(f"{url}/v1/embed/image", {"image": base64.b64encode(data).decode()})
        if status != 200:
            sys.exit(f"POST /v1/embed/image {name}: {status} {body[:300]!r}")
        r = json.loads(body)
        out[name] = {"dim": r["code"]["dim"], "packed": r["code"]["packed"],
                     "embedding": base64.b64encode(array("f", r["embedding"]).tobytes()).decode()}
    return out, time.perf_counter() - t0


def bundle_info(url: str) -> dict:
    status, body = request(f"{url}/v1/bundle")
    if status != 200:
        sys.exit(f"GET /v1/bundle: {status} {body[:300]!r}")
    return json.loads(body)


def cmd_embed(args: argparse.Namespace) -> None:
    photos = photos_of(args)
    codes, seconds = embed_all(args.url, photos)
    b = bundle_info(args.url)
    Path(args.out).write_text(json.dumps({"bundle": b, "photos": codes, "seconds": round(seconds, 2)}))
    print(json.dumps({"embedded": len(codes), "bundle": b.get("id"), "seconds": round(seconds, 2)}))


def planes(packed: str, dim: int) -> tuple[int, int]:
    raw = base64.b64decode(packed)
    n = (dim + 7) // 8
    if len(raw) != 2 * n:
        sys.exit(f"a packed code of {len(raw)} bytes for {dim} features (expected {2 * n})")
    return int.from_bytes(raw[:n], "little"), int.from_bytes(raw[n:], "little")


def cosine(a: array, b: array) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def vector(s: str) -> array:
    v = array("f")
    v.frombytes(base64.b64decode(s))
    return v


def compare(ref: dict, got: dict) -> dict:
    flips, reversals, identical, worst, cosines, dim = 0, 0, 0, 0, [], 0
    for name, g in got.items():
        r = ref[name]
        dim = r["dim"]
        if g["dim"] != dim:
            sys.exit(f"{name}: code of {g['dim']} features against a reference of {dim}")
        (p1, m1), (p2, m2) = planes(r["packed"], dim), planes(g["packed"], dim)
        f = ((p1 ^ p2) | (m1 ^ m2)).bit_count()
        flips += f
        reversals += ((p1 & m2) | (m1 & p2)).bit_count()
        identical += f == 0
        worst = max(worst, f)
        cosines.append(cosine(vector(r["embedding"]), vector(g["embedding"])))
    n = len(got)
    return {"photos": n, "features_per_code": dim, "flipped_features": flips,
            "flip_share": flips / (n * dim), "sign_reversals": reversals, "photos_identical": identical,
            "max_flips_in_a_photo": worst,
            "cosine": {"min": min(cosines), "mean": statistics.fmean(cosines), "median": statistics.median(cosines)}}


def cmd_parity(args: argparse.Namespace) -> None:
    ref = json.loads(Path(args.ref).read_text())
    photos = [p for p in photos_of(args) if p[0] in ref["photos"]]
    if len(photos) < (args.n or 1):
        sys.exit(f"{args.ref}: only {len(photos)} of the photos asked for have a reference")
    got, seconds = embed_all(args.url, photos)
    b = bundle_info(args.url)
    if b.get("id") != ref["bundle"].get("id") and not args.other_graph:
        sys.exit(f"bundle {b.get('id')} served, the reference is of {ref['bundle'].get('id')}")
    r = compare(ref["photos"], got)
    r.update({"bundle": b.get("id"), "provider": b.get("provider"),
              "reference_provider": ref["bundle"].get("provider"), "reference_bundle": ref["bundle"].get("id"),
              "ms_per_photo_one_at_a_time": round(1000 * seconds / len(photos), 2)})
    print(json.dumps(r))


def vision_batches(url: str) -> tuple[float, float]:
    """(sum, count) of the vision model's rows per runtime call, from /metrics."""
    status, body = request(f"{url}/metrics")
    if status != 200:
        sys.exit(f"GET /metrics: {status}")
    total = count = 0.0
    for line in body.decode().splitlines():
        m = re.match(r'jointspace_inference_batch_rows_(sum|count)\{[^}]*model="vision"[^}]*\} (\S+)', line)
        if m:
            if m.group(1) == "sum":
                total = float(m.group(2))
            else:
                count = float(m.group(2))
    return total, count


def _post_until(url: str, bodies: list[bytes], first: int, start_at: float, stop_at: float,
                threads: int) -> dict:
    """One client process: `threads` threads, each on its own kept-alive connection, posting `bodies` in turn
    until `stop_at` (wall clock). Requests that start at or after `start_at` and end by `stop_at` are counted."""
    u = urllib.parse.urlsplit(url)
    lock = threading.Lock()
    out = {"photos": 0, "latencies": [], "refused_429": 0, "errors": []}
    cursor = [first]

    def worker() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        while time.time() < stop_at:
            with lock:
                i = cursor[0]
                cursor[0] += 1
            body, n = bodies[i % len(bodies)]
            while True:
                s = time.time()
                try:
                    conn.request("POST", u.path, body, {"content-type": "application/json"})
                    r = conn.getresponse()
                    text = r.read()
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
                    with lock:
                        out["errors"].append(str(e)[:200])
                    if time.time() >= stop_at:
                        return
                    continue
                e = time.time()
                if r.status == 429:  # the inference queue is full: a moment, then the same batch again
                    with lock:
                        out["refused_429"] += 1
                    time.sleep(0.01)
                    continue
                if r.status != 201:
                    with lock:
                        out["errors"].append(f"{r.status} {text[:200]!r}")
                    return
                if s >= start_at and e <= stop_at:
                    with lock:
                        out["photos"] += n
                        out["latencies"].append(e - s)
                break
        conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return out


class GpuSampler:
    """`nvidia-smi` sampled every 100 ms between start and stop: the mean share of time a kernel ran
    (utilization.gpu) and the most memory in use. Nothing where there is no nvidia-smi."""

    def __init__(self) -> None:
        self.proc = None
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None

    def stop(self) -> dict | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        text, _ = self.proc.communicate(timeout=10)
        rows = []
        for line in text.splitlines():
            try:
                util, mem = (float(x) for x in line.split(","))
                rows.append((util, mem))
            except ValueError:
                continue
        if not rows:
            return None
        return {"gpu_busy_share": round(statistics.fmean(r[0] for r in rows) / 100, 3),
                "gpu_memory_mib_max": max(r[1] for r in rows), "samples": len(rows)}


def cmd_ingest(args: argparse.Namespace) -> None:
    photos = [base64.b64encode(d).decode() for _, d in photos_of(args)]
    status, body = request(f"{args.url}/v1/collections", {"name": args.collection})
    if status not in (200, 201):
        sys.exit(f"create collection {args.collection}: {status} {body[:300]!r}")
    url = f"{args.url}/v1/collections/{args.collection}/images"
    # Every request body made once, before the clock starts: the client's own JSON work stays out of the way.
    k = args.per_request
    bodies = [(json.dumps({"images": [{"data": photos[(i + j) % len(photos)]} for j in range(k)]}).encode(), k)
              for i in range(0, len(photos), k)]
    processes = max(1, min(args.processes, args.concurrency))
    threads = -(-args.concurrency // processes)
    start_at = time.time() + args.warmup_s
    stop_at = start_at + args.seconds
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(processes) as pool:
        jobs = [pool.apply_async(_post_until, (url, bodies, p * 7919, start_at, stop_at, threads))
                for p in range(processes)]
        time.sleep(max(0.0, start_at - time.time()))
        s0, c0 = vision_batches(args.url)
        sampler = GpuSampler()
        time.sleep(max(0.0, stop_at - time.time()))
        gpu = sampler.stop()
        s1, c1 = vision_batches(args.url)
        parts = [j.get() for j in jobs]
    errors = [e for p in parts for e in p["errors"]]
    if any(not e[:3].isdigit() for e in errors) and not any(p["photos"] for p in parts):
        sys.exit(f"POST {url}: {errors[:3]}")
    if any(e[:3].isdigit() for e in errors):
        sys.exit(f"POST {url}: {[e for e in errors if e[:3].isdigit()][:3]}")
    done = sum(p["photos"] for p in parts)
    lat = sorted(x for p in parts for x in p["latencies"])
    if not lat:
        sys.exit(f"POST {url}: no request finished within the {args.seconds} s timed")
    timed = {"photos": done, "seconds": args.seconds, "photos_per_s": round(done / args.seconds, 3),
             "requests": len(lat), "refused_429": sum(p["refused_429"] for p in parts),
             "connection_errors": len(errors),
             "request_p50_ms": round(1000 * lat[len(lat) // 2], 1),
             "request_p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
             "mean_rows_per_vision_call": round((s1 - s0) / (c1 - c0), 2) if c1 > c0 else None,
             "vision_calls": int(c1 - c0), "per_request": k, "concurrency": processes * threads,
             "client_processes": processes}
    if gpu:
        timed.update(gpu)
    print(json.dumps(timed))


def fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def cmd_report(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    by = {}
    for r in rows:
        by.setdefault(r["step"], []).append(r)
    summary = {"results": rows}
    md = []
    env = next((r for r in rows if r["step"] == "environment"), None)
    if env:
        md.append("Machine: " + "; ".join(f"{k} {v}" for k, v in env.items() if k not in ("step",)))
        md.append("")

    def failed(r: dict, cols: int) -> str | None:
        if "error" in r or "skipped" in r:
            why = f"error: {r['error']}" if "error" in r else f"skipped ({r['skipped']})"
            return f"| {r.get('bundle_dir')} | {why} " + "|" * cols
        return None

    if by.get("graph"):
        md += ["| graph | calls in flight | TF32 | NHWC | rows a call | crops/s | call p50 / p99 ms | first calls s |",
               "|---|---|---|---|---|---|---|---|"]
        for r in by["graph"]:
            if (f := failed(r, 7)) is not None:
                md.append(f)
                continue
            for run in r["runs"]:
                c = run["call"] or {}
                md.append(f"| {r['bundle_dir']} | {r['sessions']} | {r['tf32']} | {r['nhwc']} | {run['rows']} | "
                          f"{fmt(run['crops_per_s'], 1)} | {fmt(c.get('p50_ms'))} / {fmt(c.get('p99_ms'))} | "
                          f"{fmt(run['first_calls_s'])} |")
        md.append("")
    if by.get("ingest"):
        md += [("| bundle | max batch crops | sessions | padded | TF32 | photos/s | GPU busy | rows a call |"
                " request p50 / p99 ms | 429s |"), "|---|---|---|---|---|---|---|---|---|---|"]
        for r in by["ingest"]:
            if (f := failed(r, 9)) is not None:
                md.append(f)
                continue
            md.append(f"| {r['bundle_dir']} | {r['max_batch_crops']} | {r['vision_sessions']} | {r['pad_batches']} | "
                      f"{r['tf32']} | {fmt(r['photos_per_s'], 1)} | {fmt(r.get('gpu_busy_share'))} | "
                      f"{fmt(r['mean_rows_per_vision_call'])} | {r['request_p50_ms']} / {r['request_p99_ms']} | "
                      f"{r['refused_429']} |")
        md.append("")
    if by.get("eval"):
        md += ["| bundle | photos | R@1 / R@5 / R@10 annotation | R@1 / R@5 / R@10 search | rsum | ingest s |",
               "|---|---|---|---|---|---|"]
        for r in by["eval"]:
            if (f := failed(r, 5)) is not None:
                md.append(f)
                continue
            m = r["metrics"]
            md.append(f"| {r['bundle_dir']} | {r['images']} | {m['i2t_r1']} / {m['i2t_r5']} / {m['i2t_r10']} | "
                      f"{m['t2i_r1']} / {m['t2i_r5']} / {m['t2i_r10']} | {m['rsum']} | {r['ingest_seconds']} |")
        md.append("")
    if by.get("parity"):
        md += [("| bundle | against | photos | features flipped | share | sign reversals | identical photos |"
                " cosine min / mean | ms per photo (one at a time) |"), "|---|---|---|---|---|---|---|---|---|"]
        for r in by["parity"]:
            if (f := failed(r, 8)) is not None:
                md.append(f)
                continue
            c = r["cosine"]
            md.append(f"| {r['bundle_dir']} ({r['provider']}) | {r.get('reference_bundle')} "
                      f"({r['reference_provider']}) | {r['photos']} | "
                      f"{r['flipped_features']} of {r['photos'] * r['features_per_code']} | {r['flip_share']:.2e} | "
                      f"{r['sign_reversals']} | {r['photos_identical']} | {c['min']:.6f} / {c['mean']:.6f} | "
                      f"{r['ms_per_photo_one_at_a_time']} |")
        md.append("")
    if by.get("profile"):
        for r in by["profile"]:
            if (f := failed(r, 1)) is not None:
                md.append(f)
                continue
            md.append(f"Profile of {r['bundle_dir']} ({r.get('provider')}, {r.get('vision_sessions')} sessions, "
                      f"padded {r.get('pad_batches')}): whole path {fmt(r.get('images_per_s'), 1)} photos/s with "
                      f"{r.get('concurrency')} requests of {r.get('batch')} in flight; each stage alone "
                      f"(ms a photo, share): " + ", ".join(
                          f"{k} {v['ms_per_image']} ({v['share']:.0%})" for k, v in r["profile"].items()))
        md.append("")
    if by.get("search"):
        md += ["| collection | offered req/s | ok/s | p50 ms | p99 ms | max ms | statuses | server CPU ms/request |",
               "|---|---|---|---|---|---|---|---|"]
        for r in by["search"]:
            if "error" in r or "skipped" in r:
                md.append(f"| {r.get('collection')} | {r.get('rate')} | {r.get('error') or r.get('skipped')} ||||||")
                continue
            lat = r.get("latency_all") or {}
            md.append(f"| {r.get('collection')} | {r.get('rate')} | {fmt(r.get('throughput_ok_per_s'))} | "
                      f"{fmt(lat.get('p50_ms'))} | {fmt(lat.get('p99_ms'))} | {fmt(lat.get('max_ms'))} | "
                      f"{r.get('statuses')} | {fmt(r.get('server_cpu_ms_per_request'))} |")
        md.append("")
    for step in ("half", "cuda-refusal", "search-seed", "cli-ingest"):
        for r in by.get(step, []):
            md.append(f"- {step}: " + json.dumps({k: v for k, v in r.items() if k != "step"}))
    summary["markdown"] = "\n".join(md)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(summary["markdown"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("embed", cmd_embed), ("parity", cmd_parity), ("ingest", cmd_ingest)):
        s = sub.add_parser(name)
        s.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:28600")
        s.add_argument("--photos", required=True, help="folder of the photos")
        s.add_argument("--list", required=True, help="file of photo names, one a line")
        s.add_argument("--n", type=int, default=0, help="only the first N photos (0: all)")
        s.set_defaults(fn=fn)
        if name == "embed":
            s.add_argument("--out", required=True)
        if name == "parity":
            s.add_argument("--ref", required=True)
            s.add_argument("--other-graph", action="store_true",
                           help="the reference is another copy of the bundle (a float32 graph for a float16 one)")
        if name == "ingest":
            s.add_argument("--collection", required=True)
            s.add_argument("--per-request", type=int, default=8)
            s.add_argument("--concurrency", type=int, default=8)
            s.add_argument("--warmup-s", type=float, default=3)
            s.add_argument("--seconds", type=float, default=6)
            s.add_argument("--processes", type=int, default=8, help="client processes sharing the concurrency")
    s = sub.add_parser("report")
    s.add_argument("results", help="the check's JSON lines")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_report)
    args = p.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
