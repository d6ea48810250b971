"""Where a command may write: one policy for every folder and file the bench writes, checked before any work.

Each command declares its outputs (:class:`Output`, ``Command.outputs`` in the bench) and :func:`check` refuses, in
one line that names the flag and the path, a place that

- holds a name longer than a file system takes, or is longer than the kernel takes (every look at it fails,
  :func:`check_name`);
- is ``-`` (standard output to many tools), lies under ``/proc`` or ``/sys`` (the kernel's virtual files, not a
  place for results), is a device, a terminal, a pipe or a socket, or reaches one through links (its own or its
  folders'): a result is written whole beside its place and renamed there, which no stream takes (:func:`check_stream`);
- is itself a link (or, in a folder it keeps results in, one of those files is): a rename into place would replace
  the user's link, so the real path is asked for — links among its folders are followed;
- is a file where a directory is expected, or a directory (or a device) where a file is, or lies below a file;
- cannot be written: its nearest existing directory is not writable (or is on a read-only file system);
- lies inside a model directory, unless the output belongs to that model (its artifact folder, or the model a
  command trains): a file dropped there changes the model's fingerprint (an estimator at its top level counts as a
  weight shard);
- holds the result of earlier work (:data:`RESULTS`) and the command was not given ``--replace``, or holds something
  else (``Output.foreign``: another command's result), which ``--replace`` never moves aside;
- is a folder that holds what another command writes (:data:`~artifacts.output_kinds.KINDS`: label shards beside a
  result store, an estimator among label shards, a trained model or a distilled delta over a result store, a store in
  a collection's root, …): one folder holds one command's files, or each reads the other's as its own — but pages
  published side by side (a leaderboard and a cost table in ``docs/``) do not refuse each other.

What an output does with what it finds there is its ``keeps``:

- :data:`APPENDS`: it adds to it (a result store, label shards, a checkpoint folder, the model cache); nothing there
  is replaced;
- :data:`DERIVED`: it rebuilds it whole from inputs that stay (a leaderboard from its stores, a summary, an analysis
  of label shards), written over atomically — but not over a file it did not write (``Output.foreign``: a
  leaderboard.md written or edited by hand);
- :data:`RESULTS`: the result of work that its inputs do not give back (timings, evaluated rows, a trained estimator,
  a calibration): refused unless ``--replace``, and then moved aside to ``<path>.backup-<time>`` when the new one is
  written (:func:`artifacts.files.install`, :func:`artifacts.files.write_result`), never lost.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from runtime.errors import UsageError

from .file_flags import protection, refusal
from .files import check_replaceable
from .output_kinds import MODEL_CONFIG, Kind, mix_problem

FOLDER, FILE = "directory", "file"
"""What an output is."""
APPENDS, DERIVED, RESULTS = "appends", "derived", "results"
"""What an output does with what it finds (the module's docstring)."""
NAME_MAX, PATH_MAX = 255, 4096
"""The most bytes one name of a path may hold on Linux's file systems (ext4, XFS, Btrfs, tmpfs), and a whole path
with its end byte (``limits.h``)."""
VIRTUAL = (Path("/proc"), Path("/sys"))
"""The kernel's virtual file systems: writing there changes the system or fails half way, never stores a result."""
MODEL_WEIGHTS = ("*.safetensors", "*.bin")
"""What makes a directory a model directory: its config (:data:`~artifacts.output_kinds.MODEL_CONFIG`) beside weight
files (``pretrained.loading`` reads both)."""


@dataclass(frozen=True)
class Output:
    """One place a command writes.

    Attributes
    ----------
    path : Path
        The directory or file.
    flag : str
        What named it, as a refusal shows it: ``--out``, ``--rows``, ``HYBRIDPRESS_CACHE``, ….
    kind : str
        :data:`FOLDER` or :data:`FILE`.
    keeps : str
        :data:`APPENDS`, :data:`DERIVED` or :data:`RESULTS`.
    held : tuple[Path, ...]
        For :data:`RESULTS`: the files whose presence means a result is there (a file output: the file itself).
    what : str
        The result, as a refusal names it (``"a GateSight estimator"``).
    replace : bool
        Whether the command was told to replace a result (``--replace``).
    model : Path, optional
        The model directory this output belongs to (its artifact folder, or the model a command trains): the one
        model directory it may lie in.
    foreign : Callable[[Path], str | None], optional
        What a file of ``held`` is when this command did not write it (another command's result, a file written by
        hand), or None; such a file is refused, even with ``--replace`` (which would move it aside).
    kind_of : Kind, optional
        What this output is, of :data:`~artifacts.output_kinds.KINDS`: a folder holding another kind is refused.
    within : Path, optional
        The folder the flag named, where ``path`` is a file the command keeps in it (a store's ``summary.md``): a
        refusal of the file names the folder as the flag's value.
    """

    path: Path
    flag: str
    kind: str = FOLDER
    keeps: str = APPENDS
    held: tuple[Path, ...] = ()
    what: str = "results"
    replace: bool = False
    model: Path | None = None
    foreign: Callable[[Path], str | None] | None = None
    kind_of: Kind | None = None
    within: Path | None = None

    def refuse(self, problem: str) -> UsageError:
        return UsageError(f"{self.flag} {self.path}: {problem}")


def model_directory(path: Path) -> Path | None:
    """The model directory ``path`` is or lies in (a directory holding :data:`MODEL_CONFIG` beside weight files,
    :data:`MODEL_WEIGHTS`), or None."""
    for folder in (Path(path), *Path(path).parents):
        if (folder / MODEL_CONFIG).is_file() and any(
                weight.is_file() for pattern in MODEL_WEIGHTS for weight in folder.glob(pattern)):
            return folder
    return None


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _hops(path: Path) -> list[Path]:
    """``path`` and every place it leads to, link by link, to the end: its folders resolved, then each link of its
    last part followed in turn (at most 40, as the kernel does)."""
    hops = [path]
    for _ in range(40):
        path = Path(os.path.realpath(path.parent)) / path.name
        hops.append(path)
        if not path.is_symlink():
            break
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
        hops.append(path)
    return hops


def _stream(path: Path) -> str | None:
    """What ``path`` is when it is no file or directory on disk (``"a terminal"``, ``"a device"``, ``"a pipe"``,
    ``"a socket"``), or None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISCHR(mode):
        return "a terminal" if os.path.realpath(path).startswith(("/dev/tty", "/dev/pts/")) else "a device"
    return ("a device" if stat.S_ISBLK(mode) else "a pipe" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else None)


def check_stream(output: Output) -> None:
    """A :class:`~runtime.errors.UsageError` if ``output`` is or reaches (through links, its own or its folders')
    the kernel's virtual files (:data:`VIRTUAL`), a device, a terminal, a pipe or a socket: the bench writes a
    result whole beside its place and renames it there, which a stream cannot take (``/dev/stdout`` became a file
    holding the rows), so none is ever an output; or if ``output`` is itself a link: renaming a result into place
    would replace the user's link, so the real path is asked for (one rule for every command). A link at a file the
    command keeps inside the folder given (:attr:`Output.within`), wherever it leads, is named as that folder's."""
    if Path(output.path) == Path("-"):  # many tools' standard output: never a file named '-' written unasked
        raise output.refuse(f"'-' means standard output to many tools, and results are written whole to disk, never "
                            f"to a stream: give a {output.kind} on disk (of another name than '-')")
    path = Path(os.path.abspath(output.path))
    if output.within is not None and path.is_symlink():
        # a link of the user's inside the folder given, wherever it leads (a file, /proc, a device, nowhere): the
        # folder is the flag's value, and the link is what to move, never a place to give or to make (probe 8)
        raise UsageError(f"{output.flag} {output.within}: holds a link at {path} (to {os.readlink(path)}), where "
                         "this command writes a file of its own; it never writes through a link nor replaces one (a "
                         f"file is put in place by renaming): move the link away, or give another {output.flag}")
    hops = _hops(path)
    for hop in hops:
        virtual = next((root for root in VIRTUAL if hop == root or root in hop.parents), None)
        if virtual is not None:
            reached = "" if hop == path else f" (it leads to {hop})"
            raise output.refuse(f"{virtual} holds the kernel's virtual files, not results{reached}; give a "
                                f"{output.kind} on disk")
    stream = _stream(path)
    if stream is not None:
        real = os.path.realpath(path)
        shown = "" if real == str(path) else f" ({real})"
        if output.within is not None:  # a file of the command's own inside the folder given: the folder is named
            raise _held_inside(output, f"{stream}{shown}", path)
        raise output.refuse(f"is {stream}{shown}, not a {output.kind} on disk: results are written whole to disk "
                            f"and never to a stream; give a {output.kind} on disk")
    if path.is_symlink():
        if not path.exists():  # nothing can be made through it: mkdir says "File exists"
            raise output.refuse(f"{path} is a link to {os.readlink(path)}, which does not exist (or loops back); "
                                "remove the link or make what it names")
        target = hops[-1]
        if output.flag.startswith("-") and target.is_dir() != (output.kind == FOLDER):  # its real path: refused too
            fixed = (f"it names a {FOLDER if target.is_dir() else FILE}, where {output.flag} names a {output.kind}: "
                     f"give the path of a new {output.kind}")  # probe 25, U2
        elif output.flag.startswith("-"):
            fixed = f"give the real path ({target})"
        else:
            fixed = (f"replace the link by the folder it names (or a copy of it), {output.path} being where the "
                     "command writes")
        raise output.refuse(f"is a link (to {target}): a result is put in place by renaming, which would replace "
                            f"the link; {fixed}")


def _held_inside(output: Output, what: str, path: Path) -> UsageError:
    """The refusal of a folder given (``output.within``) that holds ``what`` at ``path``, where the command keeps a
    file of its own: the folder is what the user gave, and the thing in the way is to be moved."""
    return UsageError(f"{output.flag} {output.within}: holds {what} at {path}, where this command keeps a file of its "
                      f"own (results are written whole to disk, never to a stream): move it away, or give another "
                      f"{output.flag}")


def check_name(output: Output) -> None:
    """A :class:`~runtime.errors.UsageError` if a name in ``output``'s path is longer than a file system takes
    (:data:`NAME_MAX` bytes), or the whole path longer than the kernel takes (:data:`PATH_MAX`): every look at it
    fails (``[Errno 36] File name too long``), so it is named before anything looks (probe 13: a traceback of the
    first look in every writing command)."""
    path = os.fsencode(os.path.abspath(output.path))
    long = next((name for name in path.split(b"/") if len(name) > NAME_MAX), None)
    if long is not None:
        shown = os.fsdecode(long)[:40]
        raise output.refuse(f"holds a name of {len(long)} bytes ({shown}…), longer than the {NAME_MAX} bytes a file "
                            "system takes for one name; give a shorter one")
    if len(path) >= PATH_MAX:
        raise output.refuse(f"is {len(path)} bytes long, past the {PATH_MAX - 1} bytes the kernel takes for a path; "
                            "give a shorter one")


def check_place(output: Output) -> None:
    """A :class:`~runtime.errors.UsageError` if ``output``'s place cannot take it (the module's list, its names'
    lengths (:func:`check_name`) and :func:`check_stream`, all but the result already there)."""
    check_name(output)
    check_stream(output)
    path = Path(os.path.abspath(output.path))
    for link in path.parents:
        if link.is_symlink() and not link.exists():  # nothing can be made through it: mkdir says "File exists"
            raise output.refuse(f"{link} is a link to {os.readlink(link)}, which does not exist (or loops back); "
                                "remove the link or make what it names")
    existing = _nearest_existing(path)
    if existing == path and output.kind == FILE and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file"
        if output.within is not None:
            raise _held_inside(output, what, path)
        raise output.refuse(f"is {what}, where a file is written; move it away or give another place")
    if existing != path or output.kind == FOLDER:
        if not existing.is_dir():
            what = "a file" if existing.is_file() else _stream(existing) or "not a regular file"
            raise output.refuse(f"{existing} is {what}, not a directory")
    folder = existing if existing.is_dir() else existing.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise output.refuse(f"{folder} is not writable")
    # every result is renamed into its folder (and a lock removed from it), which an append-only folder refuses only
    # after the work (probe 12: a store's rows appended, then a bare errno); a folder still to be made has none
    if folder == path or (output.kind == FILE and folder == path.parent):
        attribute = protection(folder)
        if attribute is not None:
            raise UsageError(refusal(folder, attribute, f"give another {output.flag}"))
    model = model_directory(Path(os.path.realpath(existing)))  # a link into a model directory lands in it too
    if model is not None and (output.model is None or Path(os.path.realpath(output.model)) != model.resolve()):
        raise output.refuse(f"lies inside the model directory {model}, whose files make the model (a file there "
                            "changes its fingerprint); write it elsewhere")


def check(outputs: list[Output]) -> None:
    """Every output's place (:func:`check_place`), then every result already there that is not to be replaced
    (:func:`artifacts.files.check_replaceable`): one :class:`~runtime.errors.UsageError`, before any work."""
    for output in outputs:
        check_place(output)
    for output in outputs:
        held = output.held or ((output.path,) if output.kind == FILE else ())
        link = next((path for path in held if path.is_symlink()), None)
        if link is not None:  # moved aside by --replace, or renamed over: the user's link would be gone
            raise output.refuse(f"{link} is a link (to {os.path.realpath(link)}), where this command keeps its "
                                "result; give a folder of real files")
        for path in held:  # another command's result, or a file written by hand: never moved aside nor rebuilt over
            problem = output.foreign(path) if output.foreign is not None and path.is_file() else None
            if problem:
                raise output.refuse(problem)
        mixed = mix_problem(Path(output.path), output.kind_of) if output.kind_of is not None else None
        if mixed is not None:
            raise output.refuse(mixed)
        if output.keeps == RESULTS:
            check_replaceable(output.path, list(held), output.what, output.replace)
        _check_attributes(output, held)


def _check_attributes(output: Output, held: tuple[Path, ...]) -> None:
    """Refuse a file ``output`` writes over, moves aside (``held``, with ``--replace``) or appends to that an
    attribute keeps even root from changing (:func:`artifacts.file_flags.protection`)."""
    kept = output.kind_of.found_all(Path(output.path)) \
        if output.kind == FOLDER and output.kind_of is not None and output.kind_of.written else []
    for path in dict.fromkeys([*held, *kept]):
        attribute = protection(path, replaced=output.keeps != APPENDS)
        if attribute is not None:
            remedy = ("run without --replace, which leaves it as it is" if output.keeps == RESULTS else
                      f"give another {output.flag}")
            raise UsageError(refusal(path, attribute, remedy))
