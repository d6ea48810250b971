"""What the user is told of their own things inside a folder the bench writes (probe 8, item 14): a link at a file
the command keeps there, wherever it leads (/proc, a device, nowhere), is named as the folder's with the link to
move away (it was "--out S/summary.md: … give a file on disk", the inner file taken for the value given); a folder at
a store's lock is only moved away (the bench makes the lock itself); and a collection's file linked to a user's text
is named as a link, not as a version to restore."""

import os

import pytest

from tests.helpers import run_cli

SMALL_RUN = ["--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "1"]


def _store(folder):
    """An empty result store at ``folder``: what verify, merge, leaderboard and publish take as one."""
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("")
    return folder


def _said(flag, folder, link, target) -> str:
    return (f"{flag} {folder}: holds a link at {link} (to {target}), where this command writes a file of its own; it "
            f"never writes through a link nor replaces one (a file is put in place by renaming): move the link away, "
            f"or give another {flag}")


@pytest.mark.parametrize("name, target", [("summary.md", "/dev/stdout"), (".summary.md.sha256", "/proc/self/fd/2"),
                                          ("curves.png", "gone"), ("summary.md", "/sys/kernel/x")])
def test_a_link_at_a_report_of_the_store_is_named_as_the_stores(model_dir, tmp_path, capsys, no_model_load, name,
                                                                target):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(target)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out", out)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert _said("--out", out, out / name, target) in err, err
    assert os.readlink(out / name) == target and sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("name, target", [("leaderboard.png", "/dev/stdout"), ("leaderboard.csv", "gone")])
def test_a_link_at_a_leaderboard_file_is_named_as_the_folders(tmp_path, capsys, name, target):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / name).symlink_to(target)
    code, err = run_cli(capsys, "leaderboard", _store(tmp_path / "store"), "--out", docs)
    assert code == 2 and len(err.splitlines()) == 1 and _said("--out", docs, docs / name, target) in err, err
    assert os.readlink(docs / name) == target


@pytest.mark.parametrize("command", [["verify"], ["compare", "--model", "{model}", "--press", "keydiff", *SMALL_RUN,
                                                  "--out"]])
def test_a_folder_at_a_stores_lock_is_only_moved_away(model_dir, tmp_path, capsys, no_model_load, command):
    """The lock is the bench's own file: the user is not asked to put one there."""
    store = _store(tmp_path / "store")
    (store / ".lock").mkdir()
    argv = [part.format(model=model_dir) for part in command]
    code, err = run_cli(capsys, *argv, store)
    assert code == 2 and err.endswith(f"{store / '.lock'}: a folder, where a store's lock belongs; move it away (bench "
                                      "makes its lock file itself)"), err


def test_a_collections_file_linked_to_a_users_text_is_named_as_a_link(tmp_path, capsys):
    """Probe 8: publish said "not a complete gzip file …; restore it from version control" of a method's file that
    was never published, a link to the user's notes: there is no version to restore, and the link is the problem."""
    (tmp_path / "notes.txt").write_text("user notes\n")
    method = tmp_path / "collection" / "hybrid-byte-12l-384-0123456789" / "keydiff--flat"
    method.mkdir(parents=True)
    (method / "results.jsonl.gz").symlink_to(tmp_path / "notes.txt")
    code, err = run_cli(capsys, "publish", _store(tmp_path / "store"), "--into", tmp_path / "collection")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert (f"{method / 'results.jsonl.gz'}: a link to {tmp_path / 'notes.txt'}, which is not a complete gzip file "
            "(") in err and err.endswith("); a store keeps its own files: move the link away"), err
    assert (tmp_path / "notes.txt").read_text() == "user notes\n"
