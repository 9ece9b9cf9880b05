"""The open-vocabulary benchmark (scripts/openvocab.sh runs it, docs/results.md reports it).

Debian's `tuxpaint-stamps-default` as a gallery: every PNG stamp with a description (`<stamp>.txt` beside it,
its first line English, the others `<lang>.utf8=` translations), searched through a running server by the
first sentence of its description. The answer is the rank of the stamp's own picture.

`prepare`: the stamps folder (as `dpkg-deb -x` leaves it) -> `images/<external_id>.png` (flattened onto white:
the stamps are transparent, and the server reads RGB) and `manifest.jsonl` (one stamp a line: external id, its
path in the package, description, query, the product-title stand-in `name`). SVG-only stamps are left out (no
rasteriser here); a stamp with both keeps its PNG.
`ingest`: creates a collection on the server and adds every picture through the HTTP API, in batches, with
`external_id` = the stamp's name and metadata `{"name": <product-title stand-in>}`.
`measure`: asks every stamp's query, for the whole gallery, in `vector` mode on the collection without text
fields and in `keyword` and `hybrid` modes on the one with `text_fields: ["name"]`, and prints one JSON
object: R@1/5/10, the median rank and the share of queries with a word the text model does not know.
Standard library and Pillow only.
"""
from __future__ import annotations

import argparse
import base64
import json
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

MIN_SIDE = 16
SENTENCE_END = re.compile(r"(?<=[.!?\u2026])[\"\u201d\u2019)]*\s+(?=\S)")


def english_description(text: str) -> str:
    """The English line of a Tux Paint description file: the first line that is not a `<lang>.utf8=`
    translation, stripped ('' when there is none)."""
    for line in text.splitlines():
        if re.match(r"^[A-Za-z_@]+\.utf-?8=", line):
            continue
        if line.strip():
            return line.strip()
    return ""


def first_sentence(text: str) -> str:
    """The description up to its first sentence end (`.`, `!`, `?`, `…` followed by a space): "A chocolate
    easter egg. Yum!" -> "A chocolate easter egg."; "$.05" and "U.S.A" do not end a sentence (no space)."""
    return SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()


def shop_name(stem: str) -> str:
    """A product-title stand-in from a stamp's file name, as a shop would title the thing: words split at
    `_`, `-`, camelCase and letter-digit boundaries, sort numbers dropped (unless nothing else is left), the
    first word capitalised: "050kennedy-halfdollar" -> "Kennedy halfdollar", "chineseJunk" -> "Chinese junk"."""
    s = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", stem)
    s = re.sub(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])", " ", s)
    words = [w for w in re.split(r"[\s_\-.]+", s) if w]
    kept = [w for w in words if not w.isdigit()] or words
    out = [w if w.isupper() and len(w) > 1 else w.lower() for w in kept]
    return " ".join(out)[:1].upper() + " ".join(out)[1:] if out else stem


def stamps(root: Path) -> tuple[list[dict], Counter]:
    """Every PNG stamp under root with a non-empty English description, in path order, with a unique external
    id (the file name's stem; `-2`, `-3`, ... for one taken before in path order), and a count of what was
    left out and why."""
    skipped: Counter = Counter()
    rows, taken = [], set()
    pngs = {p.with_suffix("") for p in root.rglob("*.png")}
    for txt in sorted(root.rglob("*.txt")):
        stem = txt.with_suffix("")
        if stem not in pngs:
            skipped["svg only" if stem.with_suffix(".svg").exists() else "no picture"] += 1
            continue
        desc = english_description(txt.read_text(encoding="utf-8", errors="replace"))
        if not desc:
            skipped["empty description"] += 1
            continue
        ext, n = stem.name, 1
        while ext in taken:  # "lion" twice, and a stamp already named "lion-2"
            n += 1
            ext = f"{stem.name}-{n}"
        taken.add(ext)
        rel = stem.relative_to(root).as_posix()
        rows.append({"external_id": ext, "path": rel + ".png", "category": rel.split("/")[0],
                     "description": desc, "query": first_sentence(desc), "name": shop_name(stem.name)})
    skipped["png without description"] = len(pngs - {t.with_suffix("") for t in root.rglob("*.txt")})
    return rows, skipped


def flatten(src: Path, dst: Path) -> tuple[int, int]:
    """The picture onto white (its alpha, or its palette's transparency, as coverage), saved as RGB PNG; a side
    shorter than `MIN_SIDE` (the server's `--min-image-side`; three stamps) is padded with white to it, centred."""
    from PIL import Image

    with Image.open(src) as im:
        im = im.convert("RGBA")
        w, h = max(im.width, MIN_SIDE), max(im.height, MIN_SIDE)
        out = Image.new("RGB", (w, h), (255, 255, 255))
        out.paste(im, ((w - im.width) // 2, (h - im.height) // 2), mask=im.getchannel("A"))
        out.save(dst, format="PNG")
        return w, h


def prepare(stamps_dir: Path, out: Path) -> dict:
    rows, skipped = stamps(stamps_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    with open(out / "manifest.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            r["file"] = f"images/{r['external_id']}.png"
            r["width"], r["height"] = flatten(stamps_dir / r["path"], out / r["file"])
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    queries = Counter(r["query"] for r in rows)
    return {"stamps": len(rows), "skipped": dict(skipped), "categories": dict(Counter(r["category"] for r in rows)),
            "queries_shared_by_several_stamps": sum(1 for r in rows if queries[r["query"]] > 1)}


def recall_table(ranks: list[float], ks=(1, 5, 10)) -> dict:
    """R@K in percent and the median rank (1-based; a picture not returned is `inf`, ranked after every other,
    and a median that falls on one is None)."""
    n = len(ranks)
    out = {f"r@{k}": round(100 * sum(r <= k for r in ranks) / n, 2) for k in ks}
    med = statistics.median(ranks)
    out["median_rank"] = None if med == float("inf") else (int(med) if med == int(med) else med)
    out["not_returned"] = sum(r == float("inf") for r in ranks)
    return out


class Server:
    def __init__(self, url: str, key: str | None = None, timeout: float = 600):
        self.url, self.key, self.timeout = url.rstrip("/"), key, timeout

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json"})
        if self.key:
            req.add_header("authorization", f"Bearer {self.key}")
        for attempt in range(20):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as e:
                if e.code in (429, 503) and attempt < 19:
                    time.sleep(float(e.headers.get("retry-after") or 1))
                    continue
                raise RuntimeError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None
        raise AssertionError("unreachable")


def add_all(srv: Server, coll: str, rows: list[dict], base: Path, batch: int, log) -> float:
    """Adds every picture (batches of `batch`, JSON base64) with its external id and metadata `{"name": ...}`;
    the seconds it took."""
    t0 = time.monotonic()
    for i in range(0, len(rows), batch):
        part = rows[i:i + batch]
        images = [{"data": base64.b64encode((base / r["file"]).read_bytes()).decode(), "external_id": r["external_id"],
                   "metadata": {"name": r["name"]}} for r in part]
        ans = srv.call("POST", f"/v1/collections/{coll}/images", {"images": images})
        if len(ans["images"]) != len(part):
            raise RuntimeError(f"{coll}: {len(part)} pictures sent, {len(ans['images'])} added: {ans.get('errors')}")
        done = i + len(part)
        log(f"{coll}: {done}/{len(rows)} pictures, {done / (time.monotonic() - t0):.2f}/s")
    return time.monotonic() - t0


# How each reported mode asks the server: its request fields, and the mode the server must say it ran.
MODES = {
    "vector": ({"mode": "vector"}, "vector"),
    "text": ({"channels": ["text"]}, "hybrid"),
    "keyword": ({"mode": "keyword"}, "keyword"),
    "hybrid": ({"mode": "hybrid"}, "hybrid"),
}


def search_ranks(srv: Server, coll: str, rows: list[dict], mode: str, asked: list[dict] | None = None) -> list[dict]:
    """For each query of `asked` (default: every stamp of the gallery `rows`): the rank of its own picture
    (inf when not returned), of the best picture whose query is the same sentence (several stamps share one),
    and the unknown words."""
    fields, ran = MODES[mode]
    by_query: dict[str, set[str]] = {}
    for r in rows:
        by_query.setdefault(r["query"], set()).add(r["external_id"])
    out, cache = [], {}
    inf = float("inf")
    for r in rows if asked is None else asked:
        q = r["query"]
        if q not in cache:
            ans = srv.call("POST", f"/v1/collections/{coll}/images/search", {"text": q, "k": len(rows), **fields})
            if ans.get("mode") != ran:
                raise RuntimeError(f"asked for {fields}, the server ran {ans.get('mode')}")
            cache[q] = ({h["image"]["external_id"]: i + 1 for i, h in enumerate(ans["results"])},
                        ans.get("unknown_words", []))
        pos, unknown = cache[q]
        out.append({"external_id": r["external_id"], "rank": pos.get(r["external_id"], inf),
                    "rank_same_text": min(pos.get(e, inf) for e in by_query[q]), "unknown_words": unknown})
    return out


def summarise(rows: list[dict], per_mode: dict[str, list[dict]], gallery: int | None = None) -> dict:
    """`rows`: the stamps whose queries were asked; `gallery`: how many pictures were searched (default all
    of `rows`)."""
    n = len(rows)
    cats = sorted({r["category"] for r in rows})
    summary = {}
    for mode, res in per_mode.items():
        s = recall_table([x["rank"] for x in res])
        s["same_text"] = recall_table([x["rank_same_text"] for x in res])
        s["without_symbols"] = recall_table([x["rank"] for x, r in zip(res, rows) if r["category"] != "symbols"])
        s["by_category_r@10"] = {c: recall_table([x["rank"] for x, r in zip(res, rows) if r["category"] == c])["r@10"]
                                 for c in cats}
        summary[mode] = s
    first = next(iter(per_mode.values()))
    with_unknown = sum(1 for x in first if x["unknown_words"])
    # The server lists unknown tokens, punctuation runs among them ("($.", a curly quote): the share again,
    # counting only unknown words with a letter in them.
    with_word = sum(1 for x in first if any(re.search(r"[^\W\d_]", w) for w in x["unknown_words"]))
    words = Counter(w.lower() for x in first for w in set(x["unknown_words"]))
    return {"gallery": gallery or n, "queries": n, "distinct_queries": len({r["query"] for r in rows}),
            "queries_with_unknown_word": with_unknown, "unknown_share": round(100 * with_unknown / n, 2),
            "queries_with_unknown_letter_word": with_word, "unknown_letter_word_share": round(100 * with_word / n, 2),
            "most_common_unknown_words": words.most_common(25), "modes": summary}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_manifest(path: Path, limit: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    return rows[:limit] if limit else rows


def ingest(args) -> dict:
    rows = read_manifest(args.manifest, args.limit)
    srv = Server(args.url, args.key)
    body = {"name": args.collection, "description": "tuxpaint-stamps-default (scripts/openvocab.sh)"}
    if args.text_fields is not None:
        body["text_fields"] = [f for f in args.text_fields.split(",") if f]
    srv.call("POST", "/v1/collections", body)
    secs = add_all(srv, args.collection, rows, args.manifest.parent, args.batch, log)
    return {"collection": args.collection, "pictures": len(rows), "batch": args.batch, "seconds": round(secs, 1),
            "per_s": round(len(rows) / secs, 2)}


def measure(args) -> dict:
    rows = read_manifest(args.manifest, args.limit)
    srv = Server(args.url, args.key)
    bundle = srv.call("GET", "/v1/bundle")
    # The held-back half (odd positions) is what results report; the other half is for tuning.
    asked = {"all": rows, "tune": rows[0::2], "held-back": rows[1::2]}[args.queries]
    per_mode, timing = {}, {}
    for mode, coll in (("vector", args.plain), ("text", args.named), ("keyword", args.named), ("hybrid", args.named)):
        t = time.monotonic()
        per_mode[mode] = search_ranks(srv, coll, rows, mode, asked)
        timing[f"search_{mode}_s"] = round(time.monotonic() - t, 1)
        log(f"{mode}: {recall_table([x['rank'] for x in per_mode[mode]])}")
    # The vector ranking does not depend on text fields: the named collection, asked in vector mode, agrees.
    check = search_ranks(srv, args.named, rows, "vector", asked)
    agree = sum(a["rank"] == b["rank"] for a, b in zip(check, per_mode["vector"]))
    out = {"bundle": bundle.get("id"), "crop_mode": bundle.get("crop_mode"), "queries_asked": args.queries,
           **summarise(asked, per_mode, len(rows)),
           "vector_on_named_agrees": f"{agree}/{len(check)}", **timing}
    if args.ranks:
        with open(args.ranks, "w", encoding="utf-8") as f:
            for mode, res in per_mode.items():
                for x in res:
                    f.write(json.dumps({"mode": mode, **{k: None if v == float("inf") else v
                                                         for k, v in x.items()}}) + "\n")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m jointspace_train.evaluation.openvocab",
                                description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="stamps folder -> flattened pictures and manifest.jsonl")
    pp.add_argument("--stamps", type=Path, required=True, help="usr/share/tuxpaint/stamps of the extracted package")
    pp.add_argument("--out", type=Path, required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", required=True, help="the running server")
    common.add_argument("--manifest", type=Path, required=True, help="prepare's manifest.jsonl")
    common.add_argument("--limit", type=int, default=0, help="only the first N stamps (a quick check)")
    common.add_argument("--key", default=None, help="admin key, when the server has one")
    pi = sub.add_parser("ingest", parents=[common], help="create a collection and add every picture to it")
    pi.add_argument("--collection", required=True)
    pi.add_argument("--text-fields", default=None, help='comma-separated, e.g. "name" ("" for [])')
    pi.add_argument("--batch", type=int, default=16, help="pictures per add request")
    pm = sub.add_parser("measure", parents=[common], help="every query in each mode; prints one JSON object")
    pm.add_argument("--plain", required=True, help="the collection without text fields (vector mode)")
    pm.add_argument("--named", required=True, help='the collection with text_fields ["name"] (keyword, hybrid)')
    pm.add_argument("--ranks", type=Path, default=None, help="write every query's rank per mode here (JSON lines)")
    pm.add_argument("--queries", choices=("all", "tune", "held-back"), default="all",
                    help="which stamps' queries to ask (tune: even positions, held-back: odd; the gallery is whole)")
    args = p.parse_args(argv)
    out = {"prepare": lambda a: prepare(a.stamps, a.out), "ingest": ingest, "measure": measure}[args.cmd](args)
    print(json.dumps(out, ensure_ascii=False, default=str))


if __name__ == "__main__":
    main()
