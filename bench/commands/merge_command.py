"""``bench merge`` on the command line: its flags, what it prints, and the summary and curves of the merged store
rebuilt from every row it holds where ``bench compare`` wrote them there (:mod:`bench.store.merge` joins the
rows)."""

from __future__ import annotations

import argparse
from pathlib import Path

from artifacts.output_kinds import RESULT_STORE
from artifacts.outputs import Output

from ..reports.report import REPORTS, report_outputs, write_reports
from ..store.merge import merge_stores
from ..store.result_store import ResultStore
from .arguments import Command, kept_in


def _rebuild_reports(out: Path, rows: list[dict]) -> None:
    """The summary and curves that ``bench compare`` wrote into ``out`` (:data:`~bench.reports.report.REPORTS`), rebuilt
    from every row the merged store holds."""
    methods = {(row["press"], row["allocator"]) for row in rows}
    tasks = sorted({row["task"] for row in rows})
    lengths = sorted({str(row["length"]) for row in rows})
    write_reports(out, rows, f"{len(methods)} method(s) · {', '.join(tasks)} · {'/'.join(lengths)} tokens")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories of the shards (bench compare --shard K/N), or "
                                                  "of runs of other methods on the same contexts")
    parser.add_argument("--out", required=True, help="the merged store's directory")


def run(args) -> None:
    merged = merge_stores([Path(s) for s in args.stores], Path(args.out))
    if merged.other_batches:
        print(f"{merged.other_batches} rows held twice differ by at most {merged.largest_difference:.2g} in their "
              "NLL or KL, each answered in another padded batch: the first copy is kept (the merged store's, else "
              "the first store's given)")
    print(f"{merged.added} rows added to {merged.path}")
    out = Path(args.out)
    if any((out / name).exists() for name in REPORTS):  # they showed the rows before the merge
        _rebuild_reports(out, ResultStore(out, readonly=True).rows)


MERGE = Command("merge", "join the stores of one run's shards (compare --shard K/N), or of runs of other methods, "
                "into one", add_arguments, run,
                loads_models=False,
                interrupted=lambda args: kept_in(args.out, "the rows merged so far are",
                                                 "run the same merge again to finish (no row is added twice)"),
                outputs=lambda args: [Output(Path(args.out), "--out", kind_of=RESULT_STORE), *report_outputs(args.out)])
