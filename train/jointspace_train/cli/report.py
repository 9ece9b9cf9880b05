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
    """A markdown table of finished runs (their result.json), for docs/results.md: one for trained pipelines,
    one for the closed-form fits (`fit`)."""
    results = {d: json.loads((Path(d) / "result.json").read_text()) for d in rep.runs}
    trained = [d for d, r in results.items() if "method" not in r]
    if trained:
        report_trained(trained, results)
    fitted = [d for d, r in results.items() if "method" in r]
    if fitted:
        report_fitted(fitted, results)


def _cells(t: dict) -> str:
    return (f"{t['i2t_r1']:.1f} / {t['i2t_r5']:.1f} / {t['i2t_r10']:.1f}, {t['i2t_medr']:g} "
            f"| {t['t2i_r1']:.1f} / {t['t2i_r5']:.1f} / {t['t2i_r10']:.1f}, {t['t2i_medr']:g} | {t['rsum']:.1f}")


def report_fitted(runs: list[str], results: dict) -> None:
    print("| run | method | caption features | image input | crop | chosen on dev | dev rsum | test i2t R@1/5/10, "
          "medr | test t2i R@1/5/10, medr | test rsum | through the bundle's files: test rsum | fit time "
          "| text ms / sentence | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in runs:
        r = results[d]
        b = r.get("bundle")
        through = f"{b['test']['rsum']:.2f}" if b else "n/a (no bundle: not FNE)"
        cost = f"{b['text_ms_per_sentence']:.3f}" if b else "n/a"
        chosen = ", ".join(f"{k} {v:g}" for k, v in r["settings"].items())
        print(f"| {Path(d).name} | {r['method']} | {r['text']} | {r['features']['input']} | "
              f"{r['features']['crop']} | {chosen} | {r['dev']['rsum']:.1f} | {_cells(r['test'])} | {through} "
              f"| {r['fit_seconds']:.0f} s | {cost} | `{r['command']}` |")
        if "test_five_captions_averaged" in r:
            print(f"| {Path(d).name}, five captions averaged (the course project's variant: 1,000 text queries) "
                  f"| | | | | | | {_cells(r['test_five_captions_averaged'])} | | | | |")


def report_trained(runs: list[str], results: dict) -> None:
    print("| run | image input | taps | crop | loss | epochs (best) | dev rsum | test i2t R@1/5/10, medr "
          "| test t2i R@1/5/10, medr | test rsum | train time | command |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in runs:
        r = results[d]
        t, f, s = r["test"], r["features"], r["settings"]
        crop = f["crop"] + (", a random one per epoch" if s.get("crop_augment") else "")
        ran = len([h for h in r["history"] if "epoch" in h])
        print(f"| {Path(d).name} | {f['input']} | {f['tap_point']} | {crop} | {s['loss']} | {ran} ({r['best_epoch']}) "
              f"| {r['dev']['rsum']:.1f} "
              f"| {t['i2t_r1']:.1f} / {t['i2t_r5']:.1f} / {t['i2t_r10']:.1f}, {t['i2t_medr']:g} "
              f"| {t['t2i_r1']:.1f} / {t['t2i_r5']:.1f} / {t['t2i_r10']:.1f}, {t['t2i_medr']:g} | {t['rsum']:.1f} "
              f"| {r['seconds'] / 60:.0f} min | `{r['command']}` |")


def add_report(sub) -> None:
    p = sub.add_parser("report", help="markdown tables of finished training runs and fits")
    p.add_argument("runs", nargs="+")
    p.set_defaults(fn=lambda ns, argv: report(Report.from_args(ns)))
