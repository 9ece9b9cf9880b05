"""The soak's verdicts (scripts/soak_trend.py) on synthetic series: a saw-tooth with no trend passes whatever its
phase, the same saw-tooth with a planted climb fails. Stdlib only: `python3 -m unittest scripts/test_soak.py`
(scripts/test.sh runs it)."""

import os
import random
import struct
import sys
import tempfile
import unittest
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_trend as st  # noqa: E402

# The defaults of scripts/soak.py.
LIMIT_MB_H, MARGIN_MB = 50.0, 16.0


def defaults(seconds):
    """(warm-up, window) as scripts/soak.py picks them for a run of `seconds`."""
    return min(300, max(20, seconds // 5)), min(60, max(10, seconds // 10))


def saw(seconds, phase=0.0, leak_mb_per_h=0.0, seed=0, dt=1.0, irregular=True):
    """RSS samples every dt seconds of a server whose inference buffers are taken and given back: teeth of 3-12 s
    (7 s when not irregular), each rising from a low of 490-630 MB to a high of 1,050-1,100 MB and falling back
    (the swing measured on the VGG16 bundle), shifted by `phase` seconds, plus a steady climb."""
    r = random.Random(seed)
    teeth, t = [], -phase
    while t < seconds + 20:
        p = r.uniform(3, 12) if irregular else 7.0
        lo, hi = (r.uniform(490, 630), r.uniform(1050, 1100)) if irregular else (500.0, 1100.0)
        teeth.append((t, p, lo, hi))
        t += p
    out, k, t = [], 0, 0.0
    while t <= seconds:
        while teeth[k][0] + teeth[k][1] <= t:
            k += 1
        t0, p, lo, hi = teeth[k]
        f = (t - t0) / p
        v = lo + (hi - lo) * 2 * f if f < 0.5 else hi - (hi - lo) * 2 * (f - 0.5)
        out.append((t, v + leak_mb_per_h * t / 3600))
        t += dt
    return out


def verdict(samples, seconds):
    warmup, width = defaults(seconds)
    return st.memory_verdict(samples, warmup, width, LIMIT_MB_H, MARGIN_MB)


class TheilSen(unittest.TestCase):
    def test_a_line_is_fitted_exactly(self):
        xs = [0, 60, 120, 180, 240]
        slope, lo, hi = st.theil_sen(xs, [100 + 0.5 * x for x in xs])
        self.assertAlmostEqual(slope, 0.5)
        self.assertAlmostEqual(lo, 0.5)
        self.assertAlmostEqual(hi, 0.5)

    def test_one_odd_window_does_not_tilt_it(self):
        xs = list(range(0, 600, 60))
        ys = [500.0] * len(xs)
        ys[-1] = 1500.0  # one window caught at the top of a large batch
        slope, lo, _ = st.theil_sen(xs, ys)
        self.assertEqual(slope, 0.0)
        self.assertEqual(lo, 0.0)

    def test_percentile_is_nearest_rank(self):
        self.assertEqual(st.percentile(list(range(1, 101)), 99), 99)
        self.assertEqual(st.percentile([5], 99), 5)
        self.assertIsNone(st.percentile([], 50))


class MemoryVerdict(unittest.TestCase):
    def test_a_saw_tooth_with_no_trend_passes_at_every_phase(self):
        for seconds in (600, 3600):
            for irregular in (False, True):
                for tenth in range(0, 120, 5):  # offsets 0 to 11.5 s, a tooth's length and more
                    v = verdict(saw(seconds, phase=tenth / 10, irregular=irregular), seconds)
                    self.assertFalse(v["fail"], (seconds, irregular, tenth / 10, v["lower"], v["upper"]))

    def test_sampled_every_ten_seconds_it_still_passes(self):
        # As the old check sampled: each sample lands anywhere in a tooth, and the endpoints differ by hundreds of MB.
        for seed in range(10):
            s = saw(3600, seed=seed, dt=10)
            v = verdict(s, 3600)
            self.assertFalse(v["fail"], (seed, v["lower"], v["upper"]))

    def test_the_old_endpoint_check_depended_on_the_phase(self):
        # The check this verdict replaces: the sample after warm-up against the last, limit 64 MB.
        outcomes = set()
        for tenth in range(0, 70, 5):
            s = saw(600, phase=tenth / 10, irregular=False, dt=10)
            after = [r for t, r in s if t >= 60]
            outcomes.add(after[-1] - after[0] > 64)
        self.assertEqual(outcomes, {True, False})

    def test_the_reported_series_passes(self):
        # Lows and highs per 100 s window of the 10-minute run on the VGG16 bundle that the old check failed.
        ts = [50 + 100 * i for i in range(6)]
        lows = [498, 590, 552, 625, 574, 571]
        highs = [1056, 1061, 1063, 1081, 1101, 1069]
        for ys in (lows, highs):
            self.assertFalse(st.trend(ts, ys, LIMIT_MB_H, MARGIN_MB)["fail"], ys)

    def test_the_measured_planted_leak_fails_and_the_server_as_is_passes(self):
        # Window lows and highs of two 4-minute soaks of the fixture bundle on SQLite (24 s windows after 48 s): the
        # server as it is, whose heap settles in the first minutes, and the same with 2 KB kept per request
        # (JOINTSPACE_TEST_LEAK_BYTES_PER_REQUEST=2048), which first fills the heap's free chunks and then climbs.
        ts = [48 + 12 + 24 * i for i in range(8)]
        as_is = ([459, 459, 475, 481, 482, 482, 484, 485], [557, 566, 570, 574, 574, 576, 576, 577])
        leak = ([424, 442, 419, 463, 447, 501, 578, 593], [566, 570, 589, 580, 595, 655, 716, 731])
        self.assertFalse(any(st.trend(ts, ys, LIMIT_MB_H, MARGIN_MB)["fail"] for ys in as_is))
        self.assertTrue(st.trend(ts, leak[1], LIMIT_MB_H, MARGIN_MB)["fail"])

    def test_a_planted_climb_fails_at_every_phase(self):
        for tenth in range(0, 120, 5):
            for irregular in (False, True):
                v = verdict(saw(3600, phase=tenth / 10, leak_mb_per_h=200, irregular=irregular), 3600)
                self.assertTrue(v["lower"]["fail"] and v["upper"]["fail"], (tenth / 10, irregular, v["lower"]))
            # A short run needs a steeper climb: 600 MB/h over 10 minutes with a regular swing.
            v = verdict(saw(600, phase=tenth / 10, leak_mb_per_h=600, irregular=False), 600)
            self.assertTrue(v["fail"], (tenth / 10, v["lower"]))

    def test_a_climb_only_in_the_lower_envelope_fails(self):
        # Memory kept between inferences (the floor rises) while the peak stays where it was.
        s = [(t, v if v > 900 else v + 300 * t / 3600) for t, v in saw(3600, irregular=False)]
        v = verdict(s, 3600)
        self.assertTrue(v["lower"]["fail"])
        self.assertTrue(v["fail"])

    def test_a_flat_series_that_settles_by_a_few_mb_passes(self):
        # A short quiet run: 3 MB of allocator settling in 2 minutes is 90 MB/h, within the 16 MB margin.
        s = [(t, 200 + 3 * t / 120) for t in range(121)]
        self.assertFalse(verdict(s, 120)["fail"])
        # The planted leak of a short run: 40 MB in 2 minutes.
        s = [(t, 200 + 40 * t / 120) for t in range(121)]
        self.assertTrue(verdict(s, 120)["fail"])

    def test_too_few_windows_is_a_failure_that_says_so(self):
        s = [(t, 500.0) for t in range(30)]
        v = st.memory_verdict(s, 10, 10, LIMIT_MB_H, MARGIN_MB)
        self.assertTrue(v["fail"])
        self.assertIn("windows", v["lower"]["why"])


class LatencyVerdict(unittest.TestCase):
    def events(self, seconds, climb_ms_per_h=0.0, seed=1):
        r = random.Random(seed)
        out = []
        for i in range(seconds * 20):
            t = i / 20
            base = 20 + climb_ms_per_h * t / 3600
            out.append((t, base * (3 if r.random() < 0.02 else 1) + r.uniform(0, 5)))
        return out

    def test_steady_latency_passes(self):
        v = st.p99_verdict(self.events(600), 120, 60, 50, 10)
        self.assertFalse(v["fail"], v["p99"])
        self.assertEqual(len(v["windows"]), 7)  # whole windows only: 120-180 s ... 480-540 s

    def test_a_climbing_p99_fails(self):
        v = st.p99_verdict(self.events(3600, climb_ms_per_h=60), 300, 60, 50, 10)
        self.assertTrue(v["fail"], v["p99"])


class Plot(unittest.TestCase):
    def test_it_writes_a_png(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rss.png")
            st.png_plot(path, "RSS MB", [("RSS", saw(300), "line"), ("MIN", [(30, 500), (90, 510)], "dots")])
            with open(path, "rb") as f:
                data = f.read()
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        w, h = struct.unpack(">II", data[16:24])
        self.assertEqual((w, h), (900, 360))
        # The pixels decompress to one filter byte and three bytes per pixel for each row.
        idat = data.index(b"IDAT")
        n = struct.unpack(">I", data[idat - 4:idat])[0]
        self.assertEqual(len(zlib.decompress(data[idat + 4:idat + 4 + n])), h * (1 + 3 * w))


if __name__ == "__main__":
    unittest.main()
