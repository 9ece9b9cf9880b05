"""Markdown tables of finished runs (their result.json) for docs/results.md (the `report` command)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

PIPELINES = ("SH", "MH", "SOE", "MOE", "PH", "POE")
COLUMNS = ("i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr")


@dataclass(frozen=True)
class Report:
    """The finished run dirs to tabulate."""

    runs: tuple[str, ...]
    table2: str | None = None  # the seeds file whose Table 2 the runs are set beside


def report(rep: Report) -> None:
    """A markdown table of finished runs (their result.json), for docs/results.md: one for trained pipelines,
    one for the closed-form fits (`fit`); with `table2`, the paper's Table 2 with the runs beside it."""
    results = {d: json.loads((Path(d) / "result.json").read_text()) for d in rep.runs}
    if rep.table2:
        print(table2(paper_table2(Path(rep.table2).read_text()), results))
        return
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


def paper_table2(seeds_md: str) -> dict[tuple[str, str], dict]:
    """The paper's Table 2 rows as the seeds file quotes them: (image input, pipeline) -> the eight columns and
    their rsum, e.g. ("FC7", "MH"). Read, not re-typed, so the comparison cannot drift from the source."""
    rows = {}
    for line in seeds_md.splitlines():
        m = re.match(r"^\|\s*(FC7|FNE)-(SH|MH|SOE|MOE|PH|POE)\s*\|(.*)\|\s*$", line)
        if not m:
            continue
        cells = [float(c) for c in m.group(3).split("|")]
        if len(cells) != len(COLUMNS):
            raise ValueError(f"a Table 2 row with {len(cells)} numbers, not {len(COLUMNS)}: {line!r}")
        row = dict(zip(COLUMNS, cells))
        row["rsum"] = round(sum(v for k, v in row.items() if "medr" not in k), 2)
        rows[(m.group(1), m.group(2))] = row
    if not rows:
        raise ValueError("no Table 2 rows (| FNE-MH | ... |) in the seeds file")
    return rows


def _row(label: str, t: dict, dev: str, command: str) -> str:
    cols = " | ".join(f"{t[c]:g}" if "medr" in c else f"{t[c]:.1f}" for c in COLUMNS)
    return f"| {label} | {dev} | {cols} | {t['rsum']:.1f} | {command} |"


# Settings that do not change what a run learns: a pairing of runs ignores them with the image input. The
# epoch cap is a budget, not a setting: a run stopped by its patience never met it, and one closed at a time
# limit has it lowered to where it stopped; the row's label says how many epochs each ran.
NOT_COMPARED = ("image_input", "threads", "epochs")


def _variant(r: dict) -> str:
    """What sets a run apart beyond its pipeline and input: the crop, the taps, and a caption encoder other than
    the paper's (LSTM, GloVe words, their size)."""
    f, s = r["features"], r["settings"]
    parts = [f"{f['crop']} crop", f["tap_point"]]
    if s.get("rnn", "gru") != "gru":
        parts.append(s["rnn"].upper())
    if s.get("word_init", "random") != "random":
        parts.append(f"{s['word_init']} words to {s['word_dim']}-d"
                     + (f", frozen {s['freeze_words']} epochs" if s.get("freeze_words") else ""))
    if r.get("history"):
        ran = r["history"][-1]["epoch"]
        parts.append(f"{ran} epochs, best {r['best_epoch']}" + (", at its cap" if ran == s.get("epochs") else ""))
    return ", ".join(parts)


def _same_settings(a: dict, b: dict) -> bool:
    def key(r):
        return ({k: v for k, v in r["settings"].items() if k not in NOT_COMPARED}, r["features"]["crop"],
                r["features"]["tap_point"])
    return key(a) == key(b)


def table2(paper: dict, results: dict) -> str:
    """Per pipeline (the paper's six, then this project's CE): the paper's fc7 and FNE rows, then this project's
    single-layer baseline (`l2-last`) and FNE runs, then, for every FNE run with a baseline trained under the
    same settings, FNE minus the baseline on dev and on every test column."""
    head = ("| pipeline, row | dev rsum | i2t R@1 | R@5 | R@10 | medr | t2i R@1 | R@5 | R@10 | medr | test rsum "
            "| command |")
    out = [head, "|" + "---|" * 13]
    for pipe in (*PIPELINES, "CE"):
        ours = {inp: [(d, r) for d, r in results.items()
                      if r["settings"]["loss"] == pipe and r["features"]["input"] == inp]
                for inp in ("l2-last", "fne")}
        for (inp, name), paper_key in ((("l2-last", "single layer"), "FC7"), (("fne", "FNE"), "FNE")):
            if (paper_key, pipe) in paper:
                out.append(_row(f"{pipe}, the paper's {paper_key}", paper[(paper_key, pipe)], "", ""))
            for d, r in ours[inp]:
                label = f"{pipe}, {name} ({Path(d).name}: {_variant(r)})"
                out.append(_row(label, r["test"], f"{r['dev']['rsum']:.1f}", f"`{r['command']}`"))
        for d_fne, fne_run in ours["fne"]:
            for d_base, base in ours["l2-last"]:
                if not _same_settings(fne_run, base):
                    continue
                delta = {c: fne_run["test"][c] - base["test"][c] for c in (*COLUMNS, "rsum")}
                dev = fne_run["dev"]["rsum"] - base["dev"]["rsum"]
                cols = " | ".join(f"{delta[c]:+g}" if "medr" in c else f"{delta[c]:+.1f}" for c in COLUMNS)
                out.append(f"| {pipe}, FNE minus single layer ({Path(d_fne).name} - {Path(d_base).name}) "
                           f"| {dev:+.1f} | {cols} | {delta['rsum']:+.1f} | |")
    return "\n".join(out)

