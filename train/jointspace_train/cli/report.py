"""`report`: a markdown table of finished runs (their result.json), for docs/results.md (the library's
`evaluation.report`)."""
from __future__ import annotations

from ..evaluation.report import Report, report


def add_report(sub) -> None:
    p = sub.add_parser("report", help="markdown tables of finished training runs and fits")
    p.add_argument("--table2", metavar="SEEDS_MD",
                   help="set the runs beside the paper's Table 2 as this file quotes it (../shared/SEEDS.md)")
    p.add_argument("runs", nargs="+")
    p.set_defaults(fn=lambda ns, argv: report(Report(tuple(ns.runs), ns.table2)))
