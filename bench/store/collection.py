"""Where the stores of a collection lie: one store per setting group and method, ``<group>/<method>/``.

The published results (``docs/results/``) are such a folder, so that history grows by new rows only: adding a
method to a group adds a file of its rows alone (:mod:`bench.store.collection_publish`). ``bench verify``, ``bench
leaderboard`` and ``bench merge`` read a collection wherever they read a store (:func:`expand`): its stores together
are one set of rows, checked whole as one store would be.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path

from artifacts.output_kinds import GROUP_FOLDER
from runtime.errors import UsageError

from .row_fields import GROUP_FIELDS, method_of

STORE_FILES = ("results.jsonl", "results.jsonl.gz")
"""A store's files: a folder holding one is a store, not a collection."""
PACK = "results.jsonl.gz"
"""The file of each store of a collection."""


SEARCHES = 3
"""How many times a search below a folder with ``**`` is made while its folders vanish under it (:func:`found`)."""


def found(folder: Path, pattern: str) -> list[Path]:
    """The paths below ``folder`` that ``pattern`` matches. A folder that vanishes while it is searched holds nothing
    (probe 24, U2: a reader of a folder another process was changing said a bare ``[Errno 2]``): the standard
    library's glob takes it so; with ``**``, whose pathlib search follows no link (the standard library's follows
    links into loops), the search is made again, and a folder still changing is named in one line."""
    if "**" not in pattern:
        return [Path(folder) / path for path in glob.glob(pattern, root_dir=folder, include_hidden=True)]
    for _ in range(SEARCHES):
        try:
            return list(Path(folder).glob(pattern))
        except FileNotFoundError:
            continue
    raise UsageError(f"{folder}: its folders changed while they were read, {SEARCHES} times: read it when no other "
                     "process is changing it")


def is_collection(folder: Path) -> bool:
    """Whether ``folder`` is a collection: no store file of its own, and a store two folders below it."""
    return (folder.is_dir() and not any((folder / name).exists() for name in STORE_FILES)
            and bool(stores_below(folder)))


def group_stores(folder: Path) -> list[Path]:
    """The stores of ``folder`` where it is one setting group's folder of a collection (``<method>/`` stores below
    it, no store file of its own), sorted; none otherwise."""
    if not folder.is_dir() or any((folder / name).exists() for name in STORE_FILES):
        return []
    return sorted({path.parent for name in STORE_FILES for path in found(folder, f"*/{name}")})


def stores_below(folder: Path) -> list[Path]:
    """The stores of the collection ``folder`` (``<group>/<method>/``), sorted."""
    return sorted({path.parent for name in STORE_FILES for path in found(folder, f"*/*/{name}")})


STORE_DEPTH = 4
"""How many folders below a folder given as a store :func:`first_store_below` looks for one (a collection inside another
folder: probe 19, U3)."""


def first_store_below(directory: Path) -> Path | None:
    """The first store (in name order) at most :data:`STORE_DEPTH` folders below ``directory``, or None."""
    for depth in range(1, STORE_DEPTH + 1):
        stores = sorted(path.parent for name in STORE_FILES
                        for path in found(directory, "/".join(["*"] * depth + [name])))
        if stores:
            return stores[0]
    return None


def expand(directories: list[Path]) -> list[Path]:
    """``directories`` with each collection replaced by its stores (:func:`laid_out`), in order."""
    return [store for d in map(Path, directories) for store in (laid_out(d) if is_collection(d) else [d])]


def laid_out(collection: Path) -> list[Path]:
    """The stores of ``collection``, each checked to be where bench publish puts one: ``<group>/<method>/``, the
    group's folder named as :data:`~artifacts.output_kinds.GROUP_FOLDER`, neither folder a link. Probe 17: a store
    elsewhere (copied in, or through a link to a folder outside) was read as the collection's and checked by nothing,
    and a clone that does not follow the link lost its rows; probe 18: one deeper (a collection within) was not read;
    probe 23: nor one a folder down (a run the collection was published beside)."""
    stores = stores_below(collection)
    deeper = sorted({path.parent for name in STORE_FILES for path in found(collection, f"*/*/*/**/{name}")})
    if stores and not any(GROUP_FOLDER.fullmatch(store.parent.name) for store in [*stores, *deeper]):  # probe 22, U2
        shown = ", ".join(map(str, stores[:3])) + (", …" if len(stores) > 3 else "")
        raise UsageError(f"{collection} holds no results.jsonl and is no collection: none of its folders is a "
                         f"setting group's (<model>-<length>-<digest>), and the stores below it ({shown}) are runs "
                         "of their own: give them themselves (bench publish writes a collection into a folder that "
                         "holds no runs)")
    # probe 23, #5: a run one folder down (published into, the folder became a collection whose readers skipped it)
    shallow = sorted({path.parent for name in STORE_FILES for path in found(collection, f"*/{name}")})
    if shallow and not stores and not deeper:
        raise UsageError(f"{collection} holds the run {shallow[0]} one folder down, so it is no collection's folder: "
                         "publish into a folder that holds no runs, or move the run out first")
    for store in [*shallow, *deeper, *stores]:  # probe 18: a collection published into a folder of one went unread
        if store in shallow or store in deeper or store.is_symlink() or store.parent.is_symlink() or (
                not GROUP_FOLDER.fullmatch(store.parent.name)):
            raise UsageError(f"{store}: a store of the collection {collection} that bench publish did not put there "
                             "(a collection's stores are <group>/<method>/ folders, the group's named "
                             "<model>-<length>-<digest>, no links among them): move it out, then `bench publish "
                             f"STORE --into {collection}`")
    return stores


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def group_folder(row: dict) -> str:
    """The folder of ``row``'s setting group: ``<model>-<length>-<digest of its group fields but its code>``. Not its
    code: a group carried to a new code (``bench carry``) keeps its files where they are."""
    fields = [row.get(f) for f in GROUP_FIELDS if f != "code"]
    digest = hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:10]
    # a name of no ASCII letter or digit (``é`` alone) slugs to nothing: the folder would start with ``-``, which a
    # shell command takes for an option; the digest, of the name too, keeps such models apart
    return f"{_slug(row['model']) or 'model'}-{row['length']}-{digest}"


_DIGESTED = re.compile(r"-[0-9a-f]{10}\Z")
"""How the folder name of a label its slug does not name ends (:func:`method_folder`)."""
SLUG_LIMIT = 120
"""The most characters of a label's slug a method's folder name keeps (file systems take 255 bytes a name)."""


def method_folder(row: dict) -> str:
    """The folder of ``row``'s method in its group's: its label in characters every file system takes (``/`` as
    ``--``, every run of other characters as ``_``), one folder a label. Where that slug does not read back as the
    label (:func:`_read_back`), or ends as such a folder does, it is followed by a digest of the label: a slug loses
    what it replaced, and ``tagp(tag=a|b)``, ``tagp(tag=a b)`` and ``tagp(tag=a_b)`` were published into one folder
    (probe 14). Every label a slug does name (a name, ``kvpress:`` and fingerprint options alike) keeps its folder.
    A slug past :data:`SLUG_LIMIT` characters is cut there, before its digest (probe 15: a 300-character option
    ended ``bench publish`` in ``OSError: File name too long``)."""
    label = method_of(row)
    slug = _slug(label.replace("/", "--"))
    if len(slug) <= SLUG_LIMIT and _read_back(slug) == label and not _DIGESTED.search(slug):
        return slug
    return f"{slug[:SLUG_LIMIT]}-{hashlib.sha256(label.encode()).hexdigest()[:10]}"


def _read_back(slug: str) -> str | None:
    """The one label whose folder ``slug`` is where a slug names one: ``none``, or ``press--allocator``, the press
    ``name`` or ``name_key_value_..._`` (``name(key=value,...)``) and the allocator a name, ``kvpress_`` read as the
    ``kvpress:`` of a kvpress class's press; None for any other slug."""
    if slug == "none":
        return slug
    parts = slug.split("--")
    if len(parts) != 2:
        return None
    press, allocator = parts
    options = press.endswith("_")
    if options:
        tokens = press.removesuffix("_").split("_")
        prefixed = tokens[0] == "kvpress" and len(tokens) > 1
        name = ":".join(tokens[:2]) if prefixed else tokens[0]
        pairs = tokens[2:] if prefixed else tokens[1:]
        if not pairs or len(pairs) % 2:
            return None
        press = name + "(" + ",".join(f"{k}={v}" for k, v in zip(pairs[::2], pairs[1::2])) + ")"
    else:
        press = re.sub(r"^kvpress_", "kvpress:", press)
    return f"{press}/{allocator}"


def misplaced(store: Path, rows: list[dict]) -> tuple[int, str] | None:
    """The first of ``rows`` (by index) that the collection's store ``store`` (``<group>/<method>/``) holds outside
    its own folders, with the folders it belongs in; None if each lies in its own. A group folder is named after its
    model, length and settings (:func:`group_folder`), so a field of one changed by hand after publishing (a length
    that never ran, probe 12) leaves the row in another group's folder."""
    store = Path(store)
    here = f"{store.parent.name}/{store.name}"
    for index, row in enumerate(rows):
        own = f"{group_folder(row)}/{method_folder(row)}"
        if own != here:
            return index, own
    return None


def older_named(store: Path, rows: list[dict]) -> dict[str, str] | None:
    """``{label: its folder}`` of the methods of ``rows``, sorted, where the collection's store ``store``
    (``<group>/<method>/``, their group's) is named as a bench older than this one named a folder of theirs; None
    otherwise. Until each label had a folder of its own (probe 14) a method's folder was its slug alone, and until
    long slugs were cut (probe 15) its whole slug before the digest: a collection published then keeps those names,
    and one folder may hold the rows of labels alike in their slug (probe 15, U1)."""
    store = Path(store)
    if any(group_folder(row) != store.parent.name for row in rows):
        return None
    labels = {method_of(row): row for row in rows}
    if not any(store.name in _older_names(row) for row in labels.values()):
        return None
    return {label: method_folder(row) for label, row in sorted(labels.items())}


def _older_names(row: dict) -> set[str]:
    """The names older benches gave ``row``'s method folder that are not its name now (:func:`method_folder`)."""
    label = method_of(row)
    slug = _slug(label.replace("/", "--"))
    return {slug, f"{slug}-{hashlib.sha256(label.encode()).hexdigest()[:10]}"} - {method_folder(row)}


def case_twins(stores: list[Path]) -> str | None:
    """Why two of ``stores`` (a collection's ``<group>/<method>/``) cannot both be there, or None: the first two of
    one group whose method folders' names differ in letter case alone. Two labels may (``kvzip(prompt=A)/flat`` and
    ``kvzip(prompt=a)/flat``, each its slug, probe 16, U3), and a file system that ignores case keeps one folder of
    the two: a clone on macOS or Windows loses one method's rows, and publish there writes one's pack over the
    other's."""
    seen: dict[tuple, Path] = {}
    for store in map(Path, stores):
        first = seen.setdefault((store.parent, store.name.casefold()), store)
        if first.name != store.name:
            one, other = sorted((first, store))
            return (f"{one} and {other}: two method folders of the setting group {store.parent} whose names differ "
                    "in letter case alone, which a file system that ignores case (macOS, Windows) holds as one "
                    "folder: a clone there loses one method's rows; keep one of the two in another collection")
    return None


def collection_stores(stores: list) -> list:
    """The stores of ``stores`` (:class:`~bench.store.result_store.ResultStore`) that are a collection's."""
    collections: dict[Path, bool] = {}  # each collection's folders listed once, not once per store of it
    # a collection's store lies in a folder named as a group's, whatever its file (probe 14: a results.jsonl that
    # `compare --out` wrote beside a pack was skipped, its rows of another group read as this one's)
    return [store for store in stores if GROUP_FOLDER.fullmatch(store.directory.parent.name) and collections.setdefault(
        store.directory.parent.parent, is_collection(store.directory.parent.parent))]
