"""A finished run in parts small enough for a capped channel, and back (`split-run`, `join-run`).

A GPU machine reached through the device tool returns at most 8 files of 16 MiB each, 64 MiB in all, and a
float32 model.pt of a 2,048-d model is ~140 MB. The parts hold the weights in float16, except the word tables:
int8 rows with a float32 scale each, the rounding `quantize-text --word-table int8` applies (so a bundle with
an int8 table, the form a large model needs to stay within the committed budget, loses nothing more). The
run's result.json travels beside them unchanged; `join-run` writes a float32 model.pt that `export` and
`ensemble` read like any other run's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PART_PREFIX = "weights.safetensors.part-"
TABLE = "text.embed.weight"
SCALE = "text.embed.row_scale"


def int8_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize.py's word-table rounding: per row, scale = max|row| / 127, values rounded to int8."""
    scale = t.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return (t / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale


def split_run(run: str | Path, out: str | Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """Writes out/result.json and out/weights.safetensors.part-NNN (each at most part_bytes); returns the parts."""
    run, out = Path(run), Path(out)
    if not (run / "result.json").exists() or not (run / "model.pt").exists():
        raise ValueError(f"{run}: not a finished run (result.json and model.pt are written when training ends)")
    model = torch.load(run / "model.pt", weights_only=True)
    flat = {f"{part}.{name}": v.half().contiguous() for part, sd in model.items() for name, v in sd.items()}
    flat[TABLE], flat[SCALE] = int8_rows(model["text"]["embed.weight"].float())
    out.mkdir(parents=True, exist_ok=True)
    blob = out / "weights.safetensors"
    save_file(flat, str(blob))
    data = blob.read_bytes()
    blob.unlink()
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
    blob = run / "weights.safetensors"
    with open(blob, "wb") as f:
        for p in parts:
            f.write(p.read_bytes())
    flat = load_file(str(blob))
    blob.unlink()
    model: dict = {"proj": {}, "text": {}}
    for key, v in flat.items():
        if key == SCALE:
            continue
        part, name = key.split(".", 1)
        model[part][name] = (v.float() * flat[SCALE][:, None]) if key == TABLE else v.float()
    torch.save(model, run / "model.pt")
    result = json.loads((src / "result.json").read_text())
    (run / "result.json").write_text(json.dumps(result, indent=1))
    return run / "model.pt"
