"""``bench compare`` on the command line: its flags, and what it prints and writes when the run is done.

The terminal gets the headline tables (task-averaged accuracy and ΔNLL with intervals, needle recall over all
layers) and where the files are; ``summary.md`` holds everything (pairwise tables, per-task cells, needle recall
per layer) and ``curves.png`` the curves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import allocators
import presses
from artifacts.output_kinds import RESULT_STORE
from artifacts.outputs import Output
from runtime.errors import UsageError
from workloads.tasks import registry as tasks

from ..run.settings import DEFAULT_KEEP_FRACTIONS, EXECUTORS, KEEP_FRACTION_GRIDS
from ..run.specs import split_items, split_outside
from ..store.row_fields import ENGINES
from .arguments import (
    Command,
    add_import_argument,
    add_model_arguments,
    count,
    floats,
    import_user_modules,
    kept_in,
    model_info,
    names,
    natural,
    options,
    part,
)


def keep_fractions(text: str) -> list[float]:
    """Kept fractions p: a named grid (default, paper) or comma-separated numbers, each in (0, 1]."""
    if text in KEEP_FRACTION_GRIDS:
        return list(KEEP_FRACTION_GRIDS[text])
    fractions = floats(text)
    for typed, p in zip(names(text), fractions):
        if not 0 < p <= 1:  # NaN too
            raise argparse.ArgumentTypeError(f"kept fraction {typed} is outside (0, 1] (p, the share of entries "
                                             "kept)")
    return fractions


def compression_ratios(text: str) -> list[float]:
    """kvpress's compression ratios 1 − p, checked as typed, -> kept fractions p (kvpress's name stops here)."""
    from presses.selection import keep_fraction_from

    fractions = []
    for typed, value in zip(names(text), floats(text)):
        try:
            fraction = round(keep_fraction_from(None, value), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"compression ratio {typed} is outside [0, 1) (the evicted fraction, "
                                             "1 − kept fraction)") from None
        if fraction == 0:
            raise argparse.ArgumentTypeError(f"compression ratio {typed} keeps nothing: its kept fraction 1 − "
                                             f"{typed} rounds to 0 at 10 digits (the precision fractions are "
                                             "stored with); give a smaller one")
        fractions.append(fraction)
    if not fractions:
        raise argparse.ArgumentTypeError("no compression ratio given: give kvpress's compression ratios (evicted "
                                         "fractions) in [0, 1), comma-separated")
    return fractions


class GoneFlag(argparse.Action):
    """A flag that was removed: given, with a value or without, it is one argparse error (exit 2) that says why and
    what to type instead, rather than "unrecognized arguments"; hidden from ``--help``. Being registered, it is what a
    shortened form (``--ratio``, by argparse's prefix matching) resolves to, so that no shortened form reaches another
    flag."""

    def __init__(self, option_strings, dest, why: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is gone: {self.why}")


RATIOS_GONE = ("it meant kept fractions p, but a ratio everywhere else (kvpress, benchmarks/, the docs) is the "
               "evicted fraction 1 − p; give --keep-fractions (kept, p in (0, 1]) or --compression-ratios (evicted, "
               "1 − p in [0, 1))")
"""Why ``--ratios`` (once an alias of ``--keep-fractions``) was removed: the same word named opposite fractions."""


DEFAULT_PRESSES, DEFAULT_ALLOCATORS = ["gatesight"], ["flat"]
DEFAULT_TASKS, DEFAULT_LENGTH, DEFAULT_N = ["niah_multikey_1", "niah_multikey_2"], 384, 20
"""The first run's workload: one where eviction visibly costs accuracy on the shipped model, in about two minutes
on two cores (96 s, one thread, beside other jobs). Its full cache answers both tasks (86 % over their 40 items);
they need more than the needle's own few entries: multikey_1 hides the needle among distractor keys, multikey_2's
haystack is made of needles of the same form, which a question-free press cannot tell apart. GateSight/flat there:
3 % at p = 0.02, 30 % at 0.05, 75 % at 0.1, the full cache's 86 % from 0.3 on. At 1,024 tokens or more it keeps
the RULER tasks whole down to p = 0.02 (a flat curve): shorter contexts hold fewer entries at the same p."""


def spec_list(text: str) -> list[str]:
    """``--press`` and ``--alloc``: comma-separated ``name[key=value,...]`` items (:mod:`bench.run.specs`), split at the
    commas outside brackets, spaces around each dropped; an unbalanced bracket is an argparse error."""
    try:
        return split_items(text, ",")
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def method_pairs(text: str) -> list[str]:
    """``--methods``: comma-separated ``press/allocator`` pairs, each part ``name[key=value,...]``; spaces around
    either part dropped as :func:`~bench.commands.arguments.names` drops them around a name (``keydiff / flat`` is
    ``keydiff/flat``)."""
    try:
        return ["/".join(split_outside(pair, "/")) for pair in split_items(text, ",")]
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--press", type=spec_list, default=None,
                   help=f"comma list of presses ({', '.join(presses.available())}) and none, each with its own "
                        f"options in brackets if any: snapkv[window=64,kernel=5] (default: "
                        f"{','.join(DEFAULT_PRESSES)})")
    p.add_argument("--alloc", type=spec_list, default=None,
                   help=f"comma list of allocators: {','.join(allocators.available())}, options in brackets as for "
                        f"--press: perlayer[weights=1/2/3] (default: {','.join(DEFAULT_ALLOCATORS)})")
    add_import_argument(p)
    p.add_argument("--methods", type=method_pairs, default=None,
                   help="press/allocator pairs instead of every --press with every --alloc, each part with its own "
                        "options in brackets: gatesight/gate,kvzip/global,snapkv[window=64]/flat")
    fractions = p.add_mutually_exclusive_group()
    fractions.add_argument("--keep-fractions", type=keep_fractions, default=list(DEFAULT_KEEP_FRACTIONS),
                           help="kept fractions p in (0, 1], or a grid: default (0.02, 0.05, 0.1 … 0.9) or paper "
                                "(0.1 … 0.9)")
    fractions.add_argument("--compression-ratios", type=compression_ratios, default=None,
                           help="kvpress's naming: fractions evicted, 1 − p in [0, 1) (rows still record p); instead "
                                "of --keep-fractions")
    p.add_argument("--ratios", action=GoneFlag, why=RATIOS_GONE)
    p.add_argument("--tasks", type=names, default=DEFAULT_TASKS,
                   help=f"task names or groups ({', '.join(tasks.GROUPS)}; default: {','.join(DEFAULT_TASKS)})")
    p.add_argument("--n", type=count, default=DEFAULT_N, help="items per task")
    p.add_argument("--length", type=count, default=DEFAULT_LENGTH,
                   help="tokens of each context, its question and the answer budget (max new tokens) together: the "
                        "positions a question takes, at most the model's max_position_embeddings")
    add_model_arguments(p)
    p.add_argument("--seed", type=natural, default=0)
    p.add_argument("--out", default="results",
                   help="the result store's directory: a rerun resumes it (rows are appended); summary.md and "
                        "curves.png are rebuilt from it (one edited or replaced by hand since is first moved aside to "
                        "<name>.backup-<time>)")
    p.add_argument("--profile", default="compact", help="RULER template profile: compact or faithful")
    p.add_argument("--haystack", default="generated",
                   help="the essay haystack of the tasks that read one (group 'haystack'): generated, or real text "
                        "nothing here trains on: manpages or nodejs-docs (rows and summaries name it)")
    p.add_argument("--scbench-data", default=None, help="local microsoft/SCBench copy (jsonl dir or datasets cache)")
    p.add_argument("--press-options", type=options, default={},
                   help="key=value,... for every press of the run, each of which must have the option (e.g. "
                        "window=64 for snapkv; a kvpress:<Class> takes its own fields); one press's own: "
                        "snapkv[window=64]. A text value writes any character as %%XX (a newline %%0A, ',' %%2C, '%%' "
                        "itself %%25: kvzip[suffix=<|im_start|>assistant%%0A]). Rows name each press with its options")
    p.add_argument("--alloc-options", type=options, default={},
                   help="key=value,... for every allocator, each of which must have the option (e.g. "
                        "weights=1/2/3 for perlayer, safeguard=0.1 for adakv); one allocator's own: "
                        "adakv[safeguard=0.1]")
    p.add_argument("--batch", type=count, default=32,
                   help="compacted children of one context answered together (memory: their caches, padded)")
    p.add_argument("--jobs", type=count, default=1,
                   help="worker processes (or Ray actors), one context at a time each (each loads the model; one core "
                        "each)")
    p.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local: this process or --jobs worker processes; ray: --jobs Ray actors (pip install "
                        "-e '.[ray]'), on the cluster at --address or a Ray instance started for the run")
    p.add_argument("--address", default=None, help="a Ray cluster's address (--executor ray)")
    p.add_argument("--shard", type=part, default=None,
                   help="K/N: only the contexts at positions K, K + N, ... of the run (batch schedulers); "
                        "bench merge joins the shards' stores")
    p.add_argument("--engine", default="hf", choices=ENGINES,
                   help="hf: this project's runtime; vllm: compaction inside vLLM (serving environment; what runs "
                        "there: the README's serving section)")


def methods_of(args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """``(presses, allocators, pairs)`` of the command line: ``--methods`` alone, or ``--press`` and ``--alloc``
    (their defaults where not given). An empty ``--methods``, or one given with ``--press`` or ``--alloc`` (which it
    would override), is a ``ValueError`` naming the flags."""
    if args.methods is None:
        return args.press if args.press is not None else DEFAULT_PRESSES, \
            args.alloc if args.alloc is not None else DEFAULT_ALLOCATORS, []
    if not args.methods:
        raise UsageError("--methods is empty; give press/allocator pairs, e.g. gatesight/gate,snapkv/flat (or leave "
                         "it out to run every --press with every --alloc)")
    given = [f"{flag} {','.join(value)}" for flag, value in (("--press", args.press), ("--alloc", args.alloc))
             if value is not None]
    if given:
        raise UsageError(f"--methods {','.join(args.methods)} names the press and allocator of each pair; "
                         f"{' and '.join(given)} would be ignored: give either --methods or --press/--alloc")
    return [], [], args.methods


def run(args) -> None:

    from ..reports.report import headline_markdown, write_reports
    from ..run.compare import CompareSettings, execute, plan, run_rows

    import_user_modules(args)
    fractions = args.compression_ratios if args.compression_ratios is not None else args.keep_fractions
    chosen_presses, chosen_allocators, pairs = methods_of(args)
    run = plan(CompareSettings(
        presses=chosen_presses, allocators=chosen_allocators, keep_fractions=fractions, tasks=args.tasks, n=args.n,
        length=args.length, model=model_info(args), seed=args.seed, out=Path(args.out), profile=args.profile,
        scbench_data=Path(args.scbench_data) if args.scbench_data else None, jobs=args.jobs, batch=args.batch,
        press_options=args.press_options, alloc_options=args.alloc_options, engine=args.engine,
        haystack=args.haystack, pairs=pairs, shard=args.shard, executor=args.executor, address=args.address,
        imports=args.imports,
    ))
    store, identity = execute(run)
    if identity is None:  # a batch array with more shards than the run has contexts
        k, n = run.shard
        total = len(run.tasks) * run.n
        print(f"shard {k}/{n} holds no context: the run has {total} context(s), at positions 0 … {total - 1}, and "
              f"this shard takes positions {k}, {k + n}, …; nothing to answer and nothing written (leave "
              f"{run.out} out of bench merge)")
        return
    # the rows of the model as the run fingerprinted it when it began, whatever is written into its directory since
    rows = run_rows(store, run, identity)
    png = write_reports(run.out, rows, f"{len(run.methods)} method(s) · {', '.join(run.tasks)} · {run.length} "
                                       f"tokens · n = {run.n} per task")
    print(headline_markdown(rows))
    print(f"results: {store.path}\nsummary: {run.out / 'summary.md'} (pairwise tables, per-task cells, needle "
          f"recall per layer)\nplot:    {png}")


def _outputs(args) -> list[Output]:
    from ..reports.report import report_outputs

    return [Output(Path(args.out), "--out", kind_of=RESULT_STORE), *report_outputs(args.out)]


COMPARE = Command("compare", "score, fork and answer: presses × allocators × kept fractions", add_arguments, run,
                  outputs=_outputs,
                  interrupted=lambda args: kept_in(args.out, "what was finished is",
                                                   "run the same command again to resume"))
