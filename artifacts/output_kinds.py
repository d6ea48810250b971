"""What each command writes into a folder of its own, known by its files: one folder holds one command's files, or
each reads the other's as its own (label shards beside a result store, an estimator among label shards, a store
written into a collection's root, …). :func:`mix_problem` names a folder that holds another command's files;
:mod:`artifacts.outputs` refuses it as an output before any work.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MODEL_CONFIG = "config.json"
"""A model directory's settings: with weight files beside it, what makes a directory a model's."""
GROUP_FOLDER = re.compile(r".+-\d+-[0-9a-f]{10}")
"""The name of a setting group's folder in a collection of result stores: ``<model>-<length>-<digest>``
(:func:`bench.store.collection.group_folder` names it)."""


@dataclass(frozen=True)
class Kind:
    """What one command writes into a folder of its own, known by its files.

    Attributes
    ----------
    name : str
        As a refusal names it (``"label shards"``).
    files : tuple[str, ...]
        Glob patterns of its files: one match means the folder holds it.
    not_files : tuple[str, ...]
        Names the patterns match that are another kind's (an estimator's ``gatesight.safetensors`` is no shard).
    page : bool
        Whether it is a page that is published beside other pages (a leaderboard and a cost table both go to
        ``docs/``): no reader takes a page's folder as its own, so pages do not refuse each other.
    shows : Callable[[Path], bool], optional
        Which matches show the kind, where a pattern alone says too little: a collection's store lies in a folder
        named as a setting group's (:data:`GROUP_FOLDER`), a store of one's own in ``runs/<name>/`` does not.
    written : bool
        Whether the command writes every file of its kind in the folder (appends to a store, rewrites an
        estimator): an attribute that keeps root from writing any of them is refused first. ``bench publish``
        writes only the stores of a collection it adds rows to, and checks those itself.
    """

    name: str
    files: tuple[str, ...]
    not_files: tuple[str, ...] = ()
    page: bool = False
    shows: Callable[[Path], bool] | None = None
    written: bool = True

    def found_all(self, folder: Path) -> list[Path]:
        """Every file of this kind in ``folder``. The standard library's glob, not pathlib's: a folder that vanishes
        or cannot be read while it is searched holds nothing, where pathlib's raised (probe 23, #1: a temporary folder
        of another process under /tmp, a folder above a run's --out)."""
        return [path for pattern in self.files
                for path in sorted(Path(folder) / found for found in glob.glob(pattern, root_dir=folder,
                                                                                include_hidden=True))
                if path.is_file() and path.name not in self.not_files and (self.shows is None or self.shows(path))]

    def found_in(self, folder: Path) -> Path | None:
        """A file of this kind in ``folder``, or None."""
        return next(iter(self.found_all(folder)), None)


def _in_group_folder(pack: Path) -> bool:
    """Whether a store file ``pack`` lies in a method's folder of a setting group's folder (``<group>/<method>/``)."""
    return bool(GROUP_FOLDER.fullmatch(pack.parent.parent.name))


ESTIMATOR = Kind("a GateSight estimator (bench train)", ("gatesight.safetensors", "gatesight.json"))
DISTILLED_DELTA = Kind("a distilled hybrid's delta (bench distill --out)", ("hybrid.json", "mixers.safetensors"))
LABEL_SHARDS = Kind("label shards (bench label)", ("*--*.safetensors",))  # one per window: <corpus>--<doc>
RESULT_STORE = Kind("a result store (bench compare, bench merge)", ("results.jsonl", "results.jsonl.gz"))
COLLECTION = Kind("a collection of result stores (bench publish)", ("*/*/results.jsonl.gz",), shows=_in_group_folder,
                  written=False)
"""``docs/results``: ``<group>/<method>/results.jsonl.gz`` (:mod:`bench.store.collection`). A store written into its
root hides it: every reader takes a folder holding a store file for that store alone. A store written anywhere below
its root is refused too (:func:`collection_holding`): readers take every store two folders down as the collection's."""
COLLECTION_GROUP = Kind("the stores of one setting group of a collection (bench publish)", ("*/results.jsonl.gz",),
                        shows=_in_group_folder, written=False)
"""One group's folder of a collection, ``<method>/results.jsonl.gz`` below it: a store written there, or a collection
published into it, is one no reader of the collection reads."""
ANALYSIS = Kind("an analysis of label shards (bench analyze)", ("observations.md", "observations.json"))
COST_TABLE = Kind("a cost table (bench cost)", ("cost.json", "cost.md"), page=True)
TRAINED_MODEL = Kind("a model (bench train-model, bench fetch-model)", (MODEL_CONFIG,))
CHECKPOINTS = Kind("training checkpoints (bench train-model, bench distill --checkpoints)", ("last.pt",))
LEADERBOARD_PAGE = Kind("a leaderboard (bench leaderboard)", ("leaderboard.md", "leaderboard.csv"), page=True)
MODEL_CACHE = Kind("the model cache (bench fetch-model)", ("models/*/source.json", "*/source.json"))
"""The cache's root or its ``models/`` folder: known by the record each converted model holds
(``<name>/source.json``, :data:`pretrained.model_cache.SOURCE_FILE`)."""
KINDS = (ESTIMATOR, DISTILLED_DELTA, LABEL_SHARDS, RESULT_STORE, COLLECTION, COLLECTION_GROUP, ANALYSIS, COST_TABLE,
         TRAINED_MODEL, CHECKPOINTS, LEADERBOARD_PAGE, MODEL_CACHE)
"""The folders of one command each: a command that reads one (``bench train --labels``, a store) takes every file of
its kind there as its own, so another command's files beside them make it unusable."""


def _found(folder: Path, kind: Kind) -> tuple[Kind, Path] | None:
    """The first kind of :data:`KINDS` other than ``kind`` that ``folder`` holds, with the file that shows it; pages
    beside a page are no other kind (they share ``docs/``)."""
    if not folder.is_dir():
        return None
    for other in KINDS:
        if other == kind or other.page and kind.page:
            continue
        found = other.found_in(folder)
        if found is not None:
            return other, found
    return None


def collection_holding(folder: Path) -> tuple[Path, Path | None] | None:
    """The collection that ``folder`` lies inside, at any depth below its root, with the setting group's folder of
    it that ``folder`` lies inside (named as :data:`GROUP_FOLDER`, held or still to be made) or None; None where no
    folder above ``folder`` is a collection (:data:`COLLECTION`). ``folder`` is resolved, links and all (its nearest
    existing folder where it is still to be made), so that ``lnk/none`` with ``lnk`` a link to a group's folder is
    that group's method folder (probe 15). Every folder above is looked at, whatever its name: every reader of a
    collection takes each store two folders below its root as one of its own (probe 16: ``<collection>/zz/x``)."""
    resolved = Path(folder).resolve()
    for collection in resolved.parents:
        if COLLECTION.found_in(collection) is not None:
            below = resolved.relative_to(collection).parts
            inside = len(below) > 1 and GROUP_FOLDER.fullmatch(below[0])  # the group's folder itself is no inside
            return collection, collection / below[0] if inside else None
    return None


def other_kind(folder: Path, kind: Kind) -> str | None:
    """What ``folder`` holds of a kind of :data:`KINDS` other than ``kind``, named with the file that shows it
    (``a result store (bench compare, bench merge) (results.jsonl)``), or None."""
    found = _found(folder, kind)
    return None if found is None else f"{found[0].name} ({found[1].relative_to(folder).as_posix()})"


def mix_problem(folder: Path, kind: Kind) -> str | None:
    """Why ``folder`` cannot take what ``kind`` writes, as the rest of a refusal that names it, or None: it holds
    another command's files (:func:`other_kind`), or it lies anywhere inside a collection (a method's folder, a folder
    within one, a new folder of any name: :func:`collection_holding`) where a store is to be written, as its root and
    group folders are refused; ``bench publish`` writes a collection's stores, as a collection (``--into``), not as a
    store. A collection's group folder given where the collection is asked for (``bench publish --into``) is named
    as such, with the collection to give: published into, it would hold a collection of its own that no reader of
    the collection reads."""
    held = collection_holding(folder) if kind in (RESULT_STORE, COLLECTION) else None
    # probe 14: compare appended another group's rows beside a pack
    if kind == RESULT_STORE and held is not None and held[1] is not None:
        collection, group = held
        return (f"is inside the setting group {group.name} of the collection {collection}, whose stores "
                "bench publish alone writes, checking the collection whole first: write a store into a folder of its "
                f"own and publish it (`bench publish STORE --into {collection}`); a group of the collection is "
                f"carried whole (`bench carry {group}`)")
    found = _found(folder, kind)
    if found is None and held is not None and kind == COLLECTION:  # probe 17: a collection no reader of it reads
        return (f"is inside the collection {held[0]}, and a collection is published into whole, each row into its "
                f"group's folder (published into, this folder would hold a collection of its own that no reader of "
                f"{held[0]} reads); give the collection, {held[0]}")
    if found is None and held is not None:  # probe 16: verify read <collection>/zz/x as the collection's, unchecked
        return (f"is inside the collection {held[0]}, whose stores bench publish alone writes, checking the "
                "collection whole first (every reader of the collection reads a store two folders below it as one "
                "of its own): write a store into a folder of its own and publish it "
                f"(`bench publish STORE --into {held[0]}`)")
    if found is None:
        return None
    if kind == COLLECTION and found[0] == COLLECTION_GROUP:
        return (f"is a setting group's folder of the collection {folder.parent} (its stores are "
                f"{folder}/<method>/), and a collection is published into whole, each row into its group's folder; "
                f"give the collection, {folder.parent}")
    if kind == COLLECTION and found[0] == RESULT_STORE:
        of = (f"a store of the collection {folder.parent.parent}; give the collection, {folder.parent.parent}"
              if GROUP_FOLDER.fullmatch(folder.parent.name) else "give the collection's folder (docs/results)")
        return (f"is a result store (it holds its own {found[1].name}), not a collection of them: {of}")
    publish = (" (a store joins a collection by `bench publish STORE --into COLLECTION`)"
               if kind == RESULT_STORE and found[0] in (COLLECTION, COLLECTION_GROUP) else "")
    return (f"holds {found[0].name} ({found[1].relative_to(folder).as_posix()}), not {kind.name}: one folder holds "
            f"one command's files; give a folder of its own{publish}")
