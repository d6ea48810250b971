"""Probe 11: a file that even root cannot change (``chattr +i``) where a command writes was found only after the work,
with a bare ``[Errno 1] Operation not permitted``: a result store's results.jsonl or summary.md (``bench compare``),
and a model's head_shares.json that ``calibrate-shares --replace`` moves aside, which also left an empty backup folder.
Each is refused before any work, naming the file, its attribute and what to do; a move aside that fails anyway (the
attribute set meanwhile) puts back what it moved and leaves no empty backup folder."""

import errno
import os
import shutil

import pytest

from artifacts import files
from artifacts.file_flags import protection
from artifacts.outputs import FILE, RESULTS, Output, check_place
from runtime.errors import UsageError
from tests.helpers import run_cli


def test_the_attributes_are_read_as_the_write_needs(tmp_path, chattr):
    rows = tmp_path / "results.jsonl"
    rows.write_text("{}\n")
    assert protection(rows) is None
    chattr(rows, "+a")
    assert protection(rows) == "append-only (chattr +a)" and protection(rows, replaced=False) is None
    chattr(rows, "+i")
    assert protection(rows, replaced=False) == "immutable (chattr +i)"


@pytest.mark.parametrize("name", ["results.jsonl", "summary.md"])
def test_compare_refuses_an_immutable_file_of_its_store_before_any_work(model_dir, tmp_path, capsys, chattr,
                                                                        no_model_load, name):
    out = tmp_path / "out"
    out.mkdir()
    for each in ("results.jsonl", "summary.md"):
        (out / each).write_text("{}\n" if each == "results.jsonl" else "# summary\n")
    chattr(out / name, "+i")
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--tasks", "niah_single_1", "--n", "1", "--length",
                        "300", "--keep-fractions", "0.5", "--model", model_dir, "--out", out)
    assert code == 2 and "Errno" not in err, err
    assert err == (f"bench compare: error: {out / name} is immutable (chattr +i), which stops even root from changing "
                   f"it as this command would: remove the attribute (chattr -i {out / name}), or give another --out")


def test_calibrate_shares_refuses_an_immutable_head_shares_file_before_any_work(model_dir, tmp_path, capsys, chattr,
                                                                               no_model_load):
    model = shutil.copytree(model_dir, tmp_path / "model")
    shares = model / "calibration" / "head_shares.json"
    before = sorted(os.listdir(model))
    chattr(shares, "+i")
    code, err = run_cli(capsys, "calibrate-shares", "--model", model, "--windows", "2", "--tokens", "256",
                        "--replace")
    assert code == 2 and f"{shares} is immutable (chattr +i)" in err and "run without --replace, which leaves it as " \
        "it is" in err, err
    assert sorted(os.listdir(model)) == before  # no backup folder


def test_a_move_aside_that_fails_puts_back_what_it_moved(tmp_path, monkeypatch):
    """The attribute set after the checks: the move aside fails part-way; the first file goes back, the backup folder
    goes, and the line names the file that could not move."""
    target = tmp_path / "calibration"
    target.mkdir()
    (target / "gates.json").write_text("old calibration")
    (target / "head_shares.json").write_text("old shares")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for name in ("gates.json", "head_shares.json"):
        (scratch / name).write_text("new")
    replace = os.replace

    def refused(source, destination):
        if os.fspath(source) == os.fspath(target / "head_shares.json"):
            raise PermissionError(errno.EPERM, "Operation not permitted", os.fspath(source))
        replace(source, destination)

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(UsageError, match=f"^{target / 'head_shares.json'} cannot be moved aside to .*backup-.* "
                                         r"\(Operation not permitted\): nothing was replaced, .* holds what it held "
                                         "before"):
        files.install(sorted(scratch.iterdir()), target, log=lambda line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration", "scratch"]
    assert (target / "gates.json").read_text() == "old calibration" and (target / "head_shares.json").read_text() == \
        "old shares"


@pytest.mark.parametrize("change", ["+a", "+i"])
def test_compare_refuses_a_protected_lock_file_before_any_work(model_dir, tmp_path, capsys, chattr, no_model_load,
                                                               change):
    """Probe 12: a lock file a killed writer left, append-only, gave a PermissionError traceback (the lock is cut and
    removed, not only appended to); immutable, a bare errno."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("123")
    chattr(out / ".lock", change)
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--tasks", "niah_single_1", "--n", "1", "--length",
                        "300", "--keep-fractions", "0.5", "--model", model_dir, "--out", out)
    flag = change[1]
    attribute = "append-only (chattr +a)" if flag == "a" else "immutable (chattr +i)"
    assert code == 2 and err == (f"bench compare: error: {out / '.lock'} is {attribute}, which stops even root from "
                                 f"changing it as this command would: remove the attribute (chattr -{flag} "
                                 f"{out / '.lock'}), or write to another store"), err
    assert sorted(os.listdir(out)) == [".lock"]


def test_compare_refuses_an_append_only_store_folder_before_any_work(model_dir, tmp_path, capsys, chattr,
                                                                     no_model_load):
    """Probe 12: rows were appended to a store in an append-only folder, then its lock could not be removed nor its
    summary renamed into place: a bare errno and a stale summary."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("")
    chattr(out, "+a")
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--tasks", "niah_single_1", "--n", "1", "--length",
                        "300", "--keep-fractions", "0.5", "--model", model_dir, "--out", out)
    assert code == 2 and err == (f"bench compare: error: {out} is append-only (chattr +a), which stops even root from "
                                 f"changing it as this command would: remove the attribute (chattr -a {out}), or "
                                 "give another --out"), err
    assert sorted(os.listdir(out)) == ["results.jsonl"] and (out / "results.jsonl").read_text() == ""


def test_a_file_output_in_an_append_only_folder_is_refused(tmp_path, chattr):
    """A file is written whole beside its place and renamed there: an append-only folder refuses the rename."""
    folder = tmp_path / "rows"
    folder.mkdir()
    chattr(folder, "+a")
    with pytest.raises(UsageError, match=r"is append-only \(chattr \+a\).*or give another --rows"):
        check_place(Output(folder / "rows.jsonl", "--rows", FILE, RESULTS))
