"""``bench carry`` on the command line: its flags, and what it prints of each group carried
(:mod:`bench.run.carry`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from artifacts.output_kinds import COLLECTION, COLLECTION_GROUP, RESULT_STORE
from artifacts.outputs import DERIVED, FILE, Output, check_name
from runtime.errors import UsageError

from ..run.carry import carry
from ..store.carried_codes import CARRIED
from ..store.collection import STORE_FILES, group_stores, is_collection, stores_below
from .arguments import Command, add_import_argument, count, import_user_modules, model_info, natural


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", help="a result store (or a collection of them, docs/results, or one group's folder "
                                      "of it) whose groups were computed by an earlier code")
    parser.add_argument("--sample", type=count, default=2, help="contexts of each group rerun (default 2)")
    parser.add_argument("--sample-seed", type=natural, default=0, help="which contexts: the seed of their draw")
    parser.add_argument("--batch", type=count, default=32, help="the --batch the group was run with (default 32)")
    parser.add_argument("--model", default=None,
                        help="the model's directory, where the rows' model name is neither catalogued nor the default")
    parser.add_argument("--artifacts", action="append", default=[],
                        help="a folder an option of a method named (an estimator, a calibration), found by the "
                             "fingerprint its label shows (repeatable)")
    add_import_argument(parser)  # a group run with compare --import names presses only that module registers


def run(args) -> None:
    for folder in args.artifacts:
        if not Path(folder).is_dir():  # probe 23, U2: a file was called no such folder
            raise UsageError(f"--artifacts {folder}: " + ("not a folder (an artifact's folder is given, which holds "
                                                          "its files)" if Path(folder).exists() else "no such folder"))
    import_user_modules(args)
    if args.model is not None:  # checked as compare checks it (name, files, weights), before the store is read
        model_info(argparse.Namespace(model=args.model, device="cpu", dtype="float32", allow_download=False))
    records = carry(Path(args.store), args.sample, args.sample_seed, args.batch, model=args.model,
                    artifacts=[Path(f) for f in args.artifacts])
    for r in records:
        print(f"carried {r['rows']} rows of {r['group']['model']} at {r['group']['length']} tokens from code "
              f"{r['from']} to {r['to']}: {len(r['contexts'])} context(s) rerun, every value equal")
    if not records:
        print(f"every group of {args.store} is of this checkout's code: nothing to carry")


def carry_outputs(args) -> list[Output]:
    """What ``bench carry`` writes, each checked before a context is rerun: the store (or collection) itself, the
    :data:`~bench.store.carried_codes.CARRIED` record of each folder it may append to, and each store file it may
    rewrite. Both are written whole and renamed into place, so a link there would be replaced and an append-only file
    refuses the rename (probe 12: a user's linked carried.json became a regular file; a protected one ended the
    carry after its rows were rewritten, in a bare errno, its record lost)."""
    given = Path(args.store)
    check_name(Output(given, "store"))  # before the folder is looked in: a name too long fails every look
    group = group_stores(given)
    stores = group or (stores_below(given) if is_collection(given) else [given])
    # a collection's record lies in each group folder, a group folder's in itself, a store's in the store
    folders = [given] if group or not is_collection(given) else sorted({store.parent for store in stores})
    files = [*(folder / CARRIED for folder in folders),
             *(store / name for store in stores for name in STORE_FILES if (store / name).exists())]
    kind = COLLECTION_GROUP if group else COLLECTION if is_collection(given) else RESULT_STORE  # what it is given
    return [Output(given, "store", kind_of=kind),
            *(Output(path, "store", kind=FILE, keeps=DERIVED, within=path.parent) for path in files)]


CARRY = Command("carry", "rerun a sample of each group of an earlier code; if every value holds, name this code",
                add_arguments, run, outputs=carry_outputs)
