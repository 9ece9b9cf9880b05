"""`report`: a markdown table of finished runs (their result.json), for docs/results.md."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Report:
    runs: tuple[str, ...]

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Report:
        return cls(tuple(ns.runs))


def report(rep: Report) -> None:
    """A markdown table of finished runs (their result.json), for docs/results.md."""
    print("| run | image input | taps | crop | loss | epochs (best) | dev rsum | test i2t R@1/5/10, medr "
          "| test t2i R@1/5/10, medr | test rsum | train time | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in rep.runs:
        r = json.loads((Path(d) / "result.json").read_text())
        t, f, s = r["test"], r["features"], r["settings"]
        crop = f["crop"] + (", a random one per epoch" if s.get("crop_augment") else "")
        ran = len([h for h in r["history"] if "epoch" in h])
        print(f"| {Path(d).name} | {f['input']} | {f['tap_point']} | {crop} | {s['loss']} | {ran} ({r['best_epoch']}) "
              f"| {r['dev']['rsum']:.1f} "
              f"| {t['i2t_r1']:.1f} / {t['i2t_r5']:.1f} / {t['i2t_r10']:.1f}, {t['i2t_medr']:g} "
              f"| {t['t2i_r1']:.1f} / {t['t2i_r5']:.1f} / {t['t2i_r10']:.1f}, {t['t2i_medr']:g} | {t['rsum']:.1f} "
              f"| {r['seconds'] / 60:.0f} min | `{r['command']}` |")


def add_report(sub) -> None:
    p = sub.add_parser("report", help="markdown table of finished training runs")
    p.add_argument("runs", nargs="+")
    p.set_defaults(fn=lambda ns, argv: report(Report.from_args(ns)))
