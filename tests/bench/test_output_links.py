"""Outputs by what they really are (issue 64): every writing command, its output given as a link (to a file, to an
empty file, to a device, dangling, to a folder) or as a place that reaches a device, /proc or a pipe, is refused
before any work in one line that names it, and the link, what it names and everything beside it stay as they were
(``--rows /dev/stdout`` renamed the system's link and left a file holding the rows in its place)."""

import os
from pathlib import Path

import pytest

from bench.commands.cli import main
from tests.bench.test_output_policy import FILE_FLAGS, WRITERS, _base

pytestmark = pytest.mark.slow  # process-heavy: run by .ci/run beside the default run (-m slow)

LINKS = ["to a file", "to an empty file", "to a device", "dangling", "to a folder"]


def _state(root: Path) -> dict:
    """Every entry under ``root`` as it is: a link by its target, a file by its bytes, a folder as None."""
    return {path.relative_to(root).as_posix(): ("link", os.readlink(path)) if path.is_symlink()
            else None if path.is_dir() else path.read_bytes() for path in sorted(root.rglob("*"))}


def _link(case: str, tmp: Path) -> Path:
    """A link the user made, of one case, under ``tmp``."""
    (tmp / "a-file").write_text("kept")
    (tmp / "empty").touch()
    (tmp / "a-folder").mkdir()
    target = {"to a file": tmp / "a-file", "to an empty file": tmp / "empty", "to a device": Path(os.devnull),
              "dangling": tmp / "gone", "to a folder": tmp / "a-folder"}[case]
    (tmp / "link").symlink_to(target)
    return tmp / "link"


@pytest.mark.parametrize("case", LINKS)
@pytest.mark.parametrize("command, flag", [(c, f) for c, flags in WRITERS.items() for f in flags])
def test_an_output_given_as_a_link_is_refused_and_left_as_it_is(command, flag, case, model_dir, tmp_path, capsys,
                                                                guarded):
    import shutil

    model = shutil.copytree(model_dir, tmp_path / "model")
    place = _link(case, tmp_path)
    before = _state(tmp_path)
    code = main(_base(command, flag, place, model, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"bench {command}: error: {flag} {place}"), err
    assert "Traceback" not in err
    if flag == "--cache" and case != "dangling":  # the cache's models go below it: the link is a folder of its path
        assert f"{place} is {'a device' if case == 'to a device' else 'a file'}, not a directory" in err \
            or f"is a link (to {os.path.realpath(place)}): " in err, err
    elif case == "to a device":
        assert f"is a device ({os.devnull}), not a" in err, err
    elif case == "dangling":
        assert "which does not exist" in err, err
    else:  # the real path where it is of the kind the flag names, else a new one (probe 25, U2: refused in turn)
        kind, written = ("directory" if case == "to a folder" else "file",
                         "file" if (command, flag) in FILE_FLAGS else "directory")
        fixed = ("give the real path" if kind == written else
                 f"it names a {kind}, where {flag} names a {written}: give the path of a new {written}")
        assert f"is a link (to {os.path.realpath(place)}): " in err and fixed in err, err
    assert _state(tmp_path) == before


@pytest.mark.parametrize("place, named", [
    ("/dev/stdout", "/proc holds the kernel's virtual files, not results (it leads to /proc/self/fd/1)"),
    ("/proc/self/fd/1", "/proc holds the kernel's virtual files"),
    ("{tmp}/tofd1", "/proc holds the kernel's virtual files, not results (it leads to /proc/self/fd/1)"),
    ("{tmp}/fds/1", "/proc holds the kernel's virtual files"),
    ("/dev/null", "is a device, not a file on disk"),
    ("{tmp}/pipe", "is a pipe, not a file on disk"),
])
def test_rows_that_reach_a_stream_are_refused_before_any_work(place, named, model_dir, tmp_path, capsys, guarded):
    """The probe's cases: ``--rows /dev/stdout > log`` (the link renamed, a file left in /dev), ``--rows
    /proc/self/fd/1`` (a traceback after all the work), a user's link to it, a link to /proc's folder of them."""
    (tmp_path / "tofd1").symlink_to("/proc/self/fd/1")
    (tmp_path / "fds").symlink_to("/proc/self/fd")
    os.mkfifo(tmp_path / "pipe")
    before = os.readlink("/dev/stdout")
    place = place.format(tmp=tmp_path)
    code = main(["model-eval", "--model", str(model_dir), "--tasks", "niah_single_1", "--lengths", "300", "--n", "1",
                 "--rows", place])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--rows {place}: " in err and named in err, err
    assert os.readlink("/dev/stdout") == before and (tmp_path / "tofd1").is_symlink()


def test_an_out_of_dev_null_says_what_it_is(model_dir, tmp_path, capsys, guarded):
    code = main(["compare", "--model", str(model_dir), "--press", "keydiff", "--n", "1", "--out", os.devnull])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out {os.devnull}: is a device, not a directory on disk: results are written whole to disk" in err, err


def test_a_result_file_in_an_output_folder_that_is_a_link_is_never_moved_aside(model_dir, tmp_path, capsys,
                                                                              guarded):
    """``bench train --replace`` moves the estimator aside: a link there would be renamed away from its place."""
    (tmp_path / "mine.json").write_text("{}")
    out = tmp_path / "estimator"
    out.mkdir()
    (out / "gatesight.json").symlink_to(tmp_path / "mine.json")
    code = main(["train", "--model", str(model_dir), "--labels", str(tmp_path / "labels"), "--out", str(out),
                 "--replace"])
    err = capsys.readouterr().err
    assert code == 2 and f"{out / 'gatesight.json'} is a link (to {tmp_path / 'mine.json'})" in err, err
    assert (out / "gatesight.json").is_symlink()


def test_a_link_inside_the_output_store_is_named_as_the_stores(model_dir, tmp_path, capsys, guarded):
    """Probe 64: ``S/summary.md`` a link to the user's file.txt was refused with advice to give file.txt as --out.
    The refusal names the store given, the link in it and what to do."""
    out = tmp_path / "store"
    out.mkdir()
    (tmp_path / "file.txt").write_text("mine")
    (out / "summary.md").symlink_to(tmp_path / "file.txt")
    code = main(["compare", "--model", str(model_dir), "--press", "keydiff", "--n", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out {out}: holds a link at {out / 'summary.md'} (to {tmp_path / 'file.txt'})" in err, err
    assert "never writes through a link" in err and "real path" not in err, err
    assert (out / "summary.md").is_symlink() and (tmp_path / "file.txt").read_text() == "mine"


@pytest.fixture(scope="module")
def published(model_dir, tmp_path_factory):
    """A finished run and the collection it makes: ``(store, group folder name)``."""
    from bench.run.compare import run_compare
    from tests.helpers import compare_settings

    root = tmp_path_factory.mktemp("publish")
    run_compare(compare_settings(model_dir, root / "store", n=2), show_progress=False)
    assert main(["publish", str(root / "store"), "--into", str(root / "first")]) == 0
    [group] = (root / "first").iterdir()
    return root / "store", root / "first", group.name


@pytest.mark.parametrize("case", ["the file to a part of it", "method folder to a device", "group folder dangling",
                                  "method folder to a folder"])
def test_publish_never_replaces_nor_writes_through_a_link_in_the_collection(published, tmp_path, capsys, case):
    """Probe 64: the collection's ``<group>/<method>/results.jsonl.gz`` a link to the user's file of some of its rows:
    publish replaced the link by a file (no backup, no word); a method folder linked to /dev/null and a dangling
    group link gave ``[Errno 17] File exists``. Each is refused in one line before any write, the links kept."""
    import gzip

    store, first, group = published
    collection = tmp_path / "collection"
    (collection / group).mkdir(parents=True)
    method = collection / group / "keydiff--flat"
    if case == "the file to a part of it":
        method.mkdir()
        rows = gzip.decompress((first / group / "keydiff--flat" / "results.jsonl.gz").read_bytes()).splitlines()
        (tmp_path / "part.gz").write_bytes(gzip.compress(rows[0] + b"\n"))
        (method / "results.jsonl.gz").symlink_to(tmp_path / "part.gz")
        link = method / "results.jsonl.gz"
    elif case == "method folder to a device":
        method.symlink_to(os.devnull)
        link = method
    elif case == "group folder dangling":
        (collection / group).rmdir()
        (collection / group).symlink_to(tmp_path / "gone")
        link = collection / group
    else:
        (tmp_path / "elsewhere").mkdir()
        method.symlink_to(tmp_path / "elsewhere")
        link = method
    before = _state(tmp_path)
    code = main(["publish", str(store), "--into", str(collection)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and err[-1].startswith(f"bench publish: error: --into {collection}: {link} is a link (to "), err
    assert "never writes through nor replaces a link" in err[-1] and "Errno" not in err[-1], err
    assert _state(tmp_path) == before
