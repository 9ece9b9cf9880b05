"""`split-run` and `join-run`: a finished run in parts of a few MiB (to bring back over a capped channel), and
the run dir rebuilt from them."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SplitRun:
    run: str
    out: str
    part_mib: float

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> SplitRun:
        return cls(ns.run, ns.out, ns.part_mib)


def split_run(s: SplitRun) -> None:
    from ..training import transfer

    try:
        parts = transfer.split_run(s.run, s.out, int(s.part_mib * 2**20))
    except ValueError as e:
        sys.exit(str(e))
    print(f"{s.out}: result.json and {len(parts)} parts, {sum(p.stat().st_size for p in parts) / 2**20:.1f} MiB")


def add_split_run(sub) -> None:
    p = sub.add_parser("split-run", help="a finished run's weights (float16, int8 word table) and result.json "
                                         "in parts of a few MiB, to bring back over a capped channel")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--part-mib", type=float, default=15.0)
    p.set_defaults(fn=lambda ns, argv: split_run(SplitRun.from_args(ns)))


@dataclass(frozen=True)
class JoinRun:
    parts: str
    run_dir: str

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> JoinRun:
        return cls(ns.parts, ns.run_dir)


def join_run(s: JoinRun) -> None:
    from ..training import transfer

    try:
        print(f"{transfer.join_run(s.parts, s.run_dir)}: written")
    except ValueError as e:
        sys.exit(str(e))


def add_join_run(sub) -> None:
    p = sub.add_parser("join-run", help="rebuild a run dir (model.pt, result.json) from split-run's parts")
    p.add_argument("parts")
    p.add_argument("--run-dir", required=True)
    p.set_defaults(fn=lambda ns, argv: join_run(JoinRun.from_args(ns)))
