"""The soak's verdicts (scripts/soak.py), as pure functions: is memory or latency climbing over the run?

A server's resident memory swings with every inference (ONNX Runtime's buffers taken and given back: 500 to 1,100 MB
every few seconds with the VGG16 bundle), so one sample against another says more about the phase of the swing
than about a leak. Instead the samples after warm-up are cut into windows (a minute in a long run), and the lower
envelope (each window's minimum) and the upper envelope (each window's maximum) are each fitted against time with
Theil-Sen (the median of the slopes between all pairs of windows: one odd window cannot tilt it). A series
climbs when both
  - the lower bound of the slope's one-sided 99.5% confidence interval (Sen's, from Kendall's statistic) is above the
    slope limit: noise, however it falls, does not make a climb, and a short run, whose interval is wide, needs a
    steep climb to fail; and
  - the climb that lower bound makes over the windows' span is above a noise margin (16 MB by default): a run of a
    few minutes with flat samples has a narrow interval, and a few MB of allocator settling would otherwise read as
    many MB/h.
Per-window p99 latency is judged the same way, its limit relative to the run's median p99.

Stdlib only (scripts/test.sh runs scripts/test_soak.py with the system python3). `png_plot` draws the soak's plots
without matplotlib: lines on a grid, axis numbers and a title in a small built-in bitmap font.
"""

import math
import struct
import zlib

Z_ONE_SIDED = 2.5758  # 99.5%, one-sided


def percentile(values, q):
    """The q-th percentile (0..100) of values, nearest rank; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def windows(samples, start, width):
    """Cuts (t, value) samples into consecutive windows [start + i*width, start + (i+1)*width); keeps only whole
    windows (the last one ends at or before the last sample's time). Returns [(window mid-time, [values])] for the
    windows holding at least one value."""
    if not samples or width <= 0:
        return []
    end = max(t for t, _ in samples)
    n = int((end - start) // width) if end >= start else 0
    buckets = [[] for _ in range(n)]
    for t, v in samples:
        i = int((t - start) // width)
        if t >= start and 0 <= i < n:
            buckets[i].append(v)
    return [(start + (i + 0.5) * width, b) for i, b in enumerate(buckets) if b]


def theil_sen(xs, ys, z=None):
    """Theil-Sen slope of ys against xs, with Sen's confidence bounds (as scipy.stats.theilslopes: each bound
    one-sided at the level z gives). Returns (slope, lower, upper); None when fewer than two distinct xs."""
    z = Z_ONE_SIDED if z is None else z
    slopes = sorted(
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]
    )
    if not slopes:
        return None
    m = len(slopes)
    mid = m // 2
    slope = slopes[mid] if m % 2 else (slopes[mid - 1] + slopes[mid]) / 2
    n = len(xs)
    sigma = math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    lo = max(int(round((m - z * sigma) / 2)) - 1, 0)
    hi = min(int(round((m + z * sigma) / 2)), m - 1)
    return slope, slopes[lo], slopes[hi]


def trend(xs, ys, slope_limit, margin, min_points=5):
    """The trend rule on one series (xs in seconds, ys in any unit; slope_limit in units per hour; margin in units).
    Returns a dict: n, slope, lower, upper (units per hour), span_s, climb (lower * span, units), fail, why."""
    out = {"n": len(xs), "slope": None, "lower": None, "upper": None, "span_s": 0.0, "climb": None,
           "limit": slope_limit, "margin": margin, "fail": False, "why": ""}
    if len(xs) < min_points:
        out["fail"] = True
        out["why"] = f"only {len(xs)} windows after warm-up (at least {min_points} are needed to judge a trend)"
        return out
    fit = theil_sen(xs, ys)
    slope, lower, upper = (v * 3600 for v in fit)
    span = max(xs) - min(xs)
    climb = lower * span / 3600
    out.update(slope=slope, lower=lower, upper=upper, span_s=span, climb=climb)
    if lower > slope_limit and climb > margin:
        out["fail"] = True
        out["why"] = (f"climbs {slope:.1f}/h (at least {lower:.1f}/h at 99.5%, above the limit {slope_limit:g}/h; "
                      f"{climb:.1f} over {span:.0f} s, above the margin {margin:g})")
    elif slope > slope_limit:
        out["why"] = (f"slope {slope:.1f}/h above the limit, but within the noise (99.5% bound {lower:.1f}/h, climb "
                      f"{climb:.1f}): a longer run would tell")
    return out


def envelopes(samples, warmup, width):
    """Per window after warm-up: (mid-times, minima, maxima) of (t, value) samples."""
    ws = windows(samples, warmup, width)
    return [t for t, _ in ws], [min(v) for _, v in ws], [max(v) for _, v in ws]


def memory_verdict(samples, warmup, width, slope_mb_per_h, margin_mb):
    """RSS samples (t seconds, MB) -> {"lower": trend of window minima, "upper": trend of maxima, "fail": ...}."""
    ts, lows, highs = envelopes(samples, warmup, width)
    lower = trend(ts, lows, slope_mb_per_h, margin_mb)
    upper = trend(ts, highs, slope_mb_per_h, margin_mb)
    return {"windows": ts, "lows": lows, "highs": highs, "lower": lower, "upper": upper,
            "fail": lower["fail"] or upper["fail"]}


def latency_windows(events, start, width, min_count=20):
    """(t, latency) events -> [(mid-time, count, p50, p99)] per whole window after start with at least min_count."""
    return [(t, len(v), percentile(v, 50), percentile(v, 99))
            for t, v in windows(events, start, width) if len(v) >= min_count]


def p99_verdict(events, warmup, width, slope_pct_per_h, margin_ms):
    """Search latencies (t seconds, ms) -> the trend of per-window p99, its limit a share of the median p99."""
    ws = latency_windows(events, warmup, width)
    ts, p99 = [w[0] for w in ws], [w[3] for w in ws]
    median = percentile(p99, 50) or 0.0
    verdict = trend(ts, p99, slope_pct_per_h / 100 * median, margin_ms)
    verdict["median_p99"] = median
    return {"windows": ws, "p99": verdict, "fail": verdict["fail"]}


# --- PNG plots, stdlib only -------------------------------------------------------------------------------------

# A 3x5 bitmap font: each glyph five rows of three bits (MSB left).
_GLYPHS = {
    " ": [0, 0, 0, 0, 0], ".": [0, 0, 0, 0, 2], "-": [0, 0, 7, 0, 0], ":": [0, 2, 0, 2, 0], "/": [1, 1, 2, 4, 4],
    "%": [5, 1, 2, 4, 5], "(": [1, 2, 2, 2, 1], ")": [4, 2, 2, 2, 4], ",": [0, 0, 0, 2, 4], "=": [0, 7, 0, 7, 0],
    "+": [0, 2, 7, 2, 0], "_": [0, 0, 0, 0, 7],
    "0": [7, 5, 5, 5, 7], "1": [2, 6, 2, 2, 7], "2": [7, 1, 7, 4, 7], "3": [7, 1, 7, 1, 7], "4": [5, 5, 7, 1, 1],
    "5": [7, 4, 7, 1, 7], "6": [7, 4, 7, 5, 7], "7": [7, 1, 1, 2, 2], "8": [7, 5, 7, 5, 7], "9": [7, 5, 7, 1, 7],
    "A": [2, 5, 7, 5, 5], "B": [6, 5, 6, 5, 6], "C": [3, 4, 4, 4, 3], "D": [6, 5, 5, 5, 6], "E": [7, 4, 6, 4, 7],
    "F": [7, 4, 6, 4, 4], "G": [3, 4, 5, 5, 3], "H": [5, 5, 7, 5, 5], "I": [7, 2, 2, 2, 7], "J": [1, 1, 1, 5, 2],
    "K": [5, 5, 6, 5, 5], "L": [4, 4, 4, 4, 7], "M": [5, 7, 7, 5, 5], "N": [6, 5, 5, 5, 5], "O": [2, 5, 5, 5, 2],
    "P": [6, 5, 6, 4, 4], "Q": [2, 5, 5, 6, 3], "R": [6, 5, 6, 5, 5], "S": [3, 4, 2, 1, 6], "T": [7, 2, 2, 2, 2],
    "U": [5, 5, 5, 5, 7], "V": [5, 5, 5, 5, 2], "W": [5, 5, 7, 7, 5], "X": [5, 5, 2, 5, 5], "Y": [5, 5, 2, 2, 2],
    "Z": [7, 1, 2, 4, 7],
}
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207)]


class Canvas:
    """An RGB raster with lines and text, written as PNG."""

    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def dot(self, x, y, c):
        x, y = int(round(x)), int(round(y))
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def line(self, x0, y0, x1, y1, c, thick=1):
        n = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for k in range(n + 1):
            x, y = x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n
            for d in range(thick):
                self.dot(x, y + d, c)

    def text(self, x, y, s, c=(0, 0, 0), scale=2):
        for ch in s.upper():
            rows = _GLYPHS.get(ch, _GLYPHS[" "])
            for r, bits in enumerate(rows):
                for b in range(3):
                    if bits & (4 >> b):
                        for dx in range(scale):
                            for dy in range(scale):
                                self.dot(x + b * scale + dx, y + r * scale + dy, c)
            x += 4 * scale

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _nice(lo, hi, n=5):
    """About n round tick values covering lo..hi."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2) if first + i * step <= hi + step * 0.01]


def png_plot(path, title, series, x_label="MINUTES", y_label="", w=900, h=360, x_scale=1 / 60):
    """A line plot: series is [(name, [(x, y)], style)] with style "line" or "dots"; x in seconds (shown times
    x_scale). Writes a PNG to path."""
    pts = [p for _, s, _ in series for p in s]
    if not pts:
        return
    c = Canvas(w, h)
    left, right, top, bottom = 70, w - 20, 34, h - 40
    x0, x1 = min(p[0] for p in pts) * x_scale, max(p[0] for p in pts) * x_scale
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    pad = (y1 - y0) * 0.05 or 1
    y0, y1 = max(0.0, y0 - pad) if y0 >= 0 else y0 - pad, y1 + pad
    x1 = x1 if x1 > x0 else x0 + 1

    def X(x):
        return left + (x * x_scale - x0) / (x1 - x0) * (right - left)

    def Y(y):
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    grid = (225, 225, 225)
    for v in _nice(y0, y1):
        if y0 <= v <= y1:
            c.line(left, Y(v), right, Y(v), grid)
            c.text(4, Y(v) - 5, f"{v:g}"[:8])
    for v in _nice(x0, x1, 8):
        if x0 <= v <= x1:
            xv = left + (v - x0) / (x1 - x0) * (right - left)
            c.line(xv, top, xv, bottom, grid)
            c.text(xv - 6, bottom + 8, f"{v:g}"[:6])
    c.line(left, bottom, right, bottom, (0, 0, 0))
    c.line(left, top, left, bottom, (0, 0, 0))
    c.text(left, 8, title)
    c.text(right - 8 * len(x_label), bottom + 24, x_label)
    if y_label:
        c.text(4, bottom + 24, y_label)
    lx = left + 8 * len(title) + 30
    for k, (name, s, style) in enumerate(series):
        col = COLORS[k % len(COLORS)]
        s = sorted(s)
        if style == "dots":
            for x, y in s:
                for dx in (-2, -1, 0, 1, 2):
                    for dy in (-2, -1, 0, 1, 2):
                        c.dot(X(x) + dx, Y(y) + dy, col)
        else:
            for (xa, ya), (xb, yb) in zip(s, s[1:]):
                c.line(X(xa), Y(ya), X(xb), Y(yb), col)
        c.line(lx, 14, lx + 16, 14, col, thick=3)
        c.text(lx + 22, 9, name)
        lx += 22 + 8 * len(name) + 24
    with open(path, "wb") as f:
        f.write(c.png())


if __name__ == "__main__":
    # Judges a soak's memory again from its samples: soak_trend.py SAMPLES.jsonl WARMUP_S WINDOW_S [LIMIT_MB_H MARGIN_MB]
    import json
    import sys

    path, warm, win = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    limit, margin = (float(sys.argv[4]), float(sys.argv[5])) if len(sys.argv) > 5 else (50.0, 16.0)
    by_server = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            by_server.setdefault(d["server"], []).append((d["t"], d["VmRSS"]))
    for i, s in sorted(by_server.items()):
        v = memory_verdict(s, warm, win, limit, margin)
        for side in ("lower", "upper"):
            d = v[side]
            print(f"server {i} {side}: lows/highs {[round(x) for x in v['lows' if side == 'lower' else 'highs']]} "
                  f"slope {d['slope']} MB/h, bounds {d['lower']} .. {d['upper']}, climb {d['climb']}, margin "
                  f"{d['margin']}: {'FAIL' if d['fail'] else 'pass'} {d['why']}")
