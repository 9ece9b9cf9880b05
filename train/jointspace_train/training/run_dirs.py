"""Training runs on disk: a finished run's result and model, a run in progress's best model so far, and the
models rebuilt from their saved state."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .inputs import Prepared


def open_run(run_dir):
    """The run's folder (made if missing), and `say`: print a line and append it to the run's log.txt."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    log = open(run / "log.txt", "a")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    return run, say


def finished_run(run: Path):
    """A finished run's Result and model state (model.pt)."""
    import torch

    from .loop import Result

    if not (run / "result.json").exists() or not (run / "model.pt").exists():
        sys.exit(f"{run}: not a finished run (result.json and model.pt are written when training ends)")
    return Result(**json.loads((run / "result.json").read_text())), torch.load(run / "model.pt", weights_only=True)


def run_model(run: Path):
    """A run's kept model ((proj state, text state)) and settings: a finished run's model.pt, otherwise the best
    model so far in its checkpoint (so a run still training can be measured)."""
    import torch

    if (run / "model.pt").exists() and (run / "result.json").exists():
        result, state = finished_run(run)
        return (state["proj"], state["text"]), result.settings
    if not (run / "checkpoint.pt").exists():
        sys.exit(f"{run}: neither a finished run (model.pt) nor one in progress (checkpoint.pt)")
    st = torch.load(run / "checkpoint.pt", weights_only=False)["state"]
    if st["best"] is None:
        sys.exit(f"{run}: no epoch finished yet")
    return st["best"], st["result"]["settings"]


def models_of(d: Prepared, states: list, settings: list):
    """The (projection, text encoder) of each run, in eval mode."""
    from dataclasses import fields

    from .loop import Settings, text_encoder
    from .model import ImageProjection

    known = {f.name for f in fields(Settings)}
    out = []
    for (proj_state, text_state), s in zip(states, settings):
        proj = ImageProjection(d.inputs["train"].shape[1], s["joint_dim"], s["use_abs"])
        # Settings newer than the run were at their defaults there.
        text = text_encoder(Settings(**{k: v for k, v in s.items() if k in known}), d.tok.get_vocab_size())
        proj.load_state_dict(proj_state), text.load_state_dict(text_state)
        out.append((proj.eval(), text.eval()))
    return out
