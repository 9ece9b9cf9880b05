"""A finished run in parts small enough for a capped channel, and back (`split-run`, `join-run`).

A GPU machine reached through a channel that carries at most 64 MiB and returns at most 8 files of 16 MiB each, and a
float32 model.pt of a 2,048-d model is ~140 MB. The parts hold the weights in float16, except the word tables:
int8 rows with a float32 scale each, the rounding `quantize-text --word-table int8` applies (so a bundle with
an int8 table, the form a large model needs to stay within the committed budget, loses nothing more). The
run's result.json travels beside them unchanged; `join-run` writes a float32 model.pt that `export` and
`ensemble` read like any other run's.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load, save

from ..text.int8 import int8_rows

PART_PREFIX = "weights.safetensors.part-"
TABLE = "text.embed.weight"
SCALE = "text.embed.row_scale"


def split_run(run: str | Path, out: str | Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """Writes out/result.json and out/weights.safetensors.part-NNN (each at most part_bytes); returns the parts."""
    run, out = Path(run), Path(out)
    if not (run / "result.json").exists() or not (run / "model.pt").exists():
        raise ValueError(f"{run}: not a finished run (result.json and model.pt are written when training ends)")
    model = torch.load(run / "model.pt", weights_only=True)
    flat = {f"{part}.{name}": v.half().contiguous() for part, sd in model.items() for name, v in sd.items()}
    flat[TABLE], flat[SCALE] = map(torch.from_numpy, int8_rows(model["text"]["embed.weight"].float().numpy()))
    out.mkdir(parents=True, exist_ok=True)
    data = save(flat)
    parts = []
    for k in range(0, len(data), part_bytes):
        p = out / f"{PART_PREFIX}{k // part_bytes:03d}"
        p.write_bytes(data[k : k + part_bytes])
        parts.append(p)
    shutil.copyfile(run / "result.json", out / "result.json")
    return parts


def join_run(src: str | Path, run: str | Path) -> Path:
    """Rebuilds run/model.pt (float32) and run/result.json from split_run's output in src."""
    src, run = Path(src), Path(run)
    parts = sorted(src.glob(PART_PREFIX + "*"))
    if not parts or not (src / "result.json").exists():
        raise ValueError(f"{src}: no {PART_PREFIX}* parts and result.json (split-run's output)")
    run.mkdir(parents=True, exist_ok=True)
    flat = load(b"".join(p.read_bytes() for p in parts))
    model: dict = {"proj": {}, "text": {}}
    for key, v in flat.items():
        if key == SCALE:
            continue
        part, name = key.split(".", 1)
        model[part][name] = (v.float() * flat[SCALE][:, None]) if key == TABLE else v.float()
    torch.save(model, run / "model.pt")
    shutil.copyfile(src / "result.json", run / "result.json")
    return run / "model.pt"
