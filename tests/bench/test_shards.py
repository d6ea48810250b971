"""Shards of a batch array: a damaged or unfinished shard is named as such by ``bench merge`` (and ``bench verify``),
not as a shard of another run; an empty shard (more shards than contexts) is a note, not a failed job."""

import json

import pytest

from bench.commands.cli import main
from bench.run.compare import CompareSettings, run_compare
from bench.store.result_store import ResultStore
from pretrained import loading

SETTINGS = dict(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5], tasks=["niah_single_1"],
                length=300)


@pytest.fixture(scope="module")
def shards(model_dir, tmp_path_factory):
    """The two shards of a run of two contexts, one context each, and the whole run in one store."""
    root = tmp_path_factory.mktemp("shards")
    for k in range(2):
        run_compare(CompareSettings(**SETTINGS, n=2, model=str(model_dir), out=root / f"s{k}", shard=(k, 2)),
                    show_progress=False)
    run_compare(CompareSettings(**SETTINGS, n=2, model=str(model_dir), out=root / "whole"), show_progress=False)
    return [root / "s0", root / "s1", root / "whole"]


def _copy(source, directory, keep=lambda lines: lines):
    """``source``'s store in ``directory``, its lines (bytes, newline included) passed through ``keep``."""
    directory.mkdir()
    lines = (source / "results.jsonl").read_bytes().splitlines(True)
    (directory / "results.jsonl").write_bytes(b"".join(keep(lines)))
    return directory


def _merge(capsys, *stores, out) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["merge", *map(str, stores), "--out", str(out)])
    return code, capsys.readouterr().err


def test_whole_shards_merge(shards, tmp_path, capsys):
    code, err = _merge(capsys, *shards[:2], out=tmp_path / "merged")
    assert code == 0, err


def test_a_shard_whose_last_line_is_cut_is_named_damaged(shards, tmp_path, capsys):
    cut = _copy(shards[1], tmp_path / "cut", lambda lines: [*lines[:-1], lines[-1][:40]])
    code, err = _merge(capsys, shards[0], cut, out=tmp_path / "merged")
    lines = len((cut / "results.jsonl").read_bytes().splitlines())
    assert code == 2 and f"{cut / 'results.jsonl'}: line {lines}, the last, is cut short" in err, err
    assert "stopped before finishing; rerun it (it resumes)" in err and "methods differ" not in err
    code, err = main(["verify", str(cut)]), capsys.readouterr().err
    assert code == 2 and "is cut short" in err


def test_a_last_line_cut_after_a_nested_object_is_cut_short_and_a_resume_removes_it(shards, tmp_path, capsys):
    """Rows hold nested objects (model_parts, run, per-layer fields), so a kill can cut a line right after a '}':
    it is named cut short, not a line that is no row; the resumed store drops it before its first new row, so no
    reader warns of it ever after (probe 61)."""
    whole = (shards[1] / "results.jsonl").read_bytes().splitlines(True)
    cut = _copy(shards[1], tmp_path / "cut", lambda lines: [*lines[:-1], lines[-1][: lines[-1].index(b"}") + 1]])
    code, err = main(["verify", str(cut)]), capsys.readouterr().err
    assert code == 2 and f"line {len(whole)}, the last, is cut short" in err and "not result rows" not in err, err
    store = ResultStore(cut)
    store.append(json.loads(whole[-1]))
    store.close()
    assert (cut / "results.jsonl").read_bytes() == b"".join(whole)
    assert f"line {len(whole)}, cut short by the run that stopped, removed" in capsys.readouterr().err
    resumed = ResultStore(cut, readonly=True)
    assert len(resumed.rows) == len(whole) and not resumed.skipped and resumed.cut_line is None
    assert "warning" not in capsys.readouterr().err


def test_a_shard_without_its_compressed_rows_is_named_unfinished(shards, tmp_path, capsys):
    baseline_only = _copy(shards[1], tmp_path / "partial",
                          lambda lines: [line for line in lines if json.loads(line)["press"] == "none"])
    code, err = _merge(capsys, shards[0], baseline_only, out=tmp_path / "merged")
    assert code == 2 and f"{baseline_only / 'results.jsonl'} holds no rows of keydiff/flat p=0.5" in err, err
    assert f"the run of {baseline_only} did not finish (rerun it, it resumes)" in err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


def test_a_context_missing_a_row_is_named_incomplete(shards, tmp_path, capsys):
    def drop_first_compacted(lines):
        at = next(i for i, line in enumerate(lines) if json.loads(line)["press"] != "none")
        return lines[:at] + lines[at + 1:]

    holed = _copy(shards[2], tmp_path / "holed", drop_first_compacted)  # item 0 lacks a row item 1 has
    for argv in (["merge", holed, "--out", tmp_path / "merged"], ["verify", holed]):
        capsys.readouterr()
        code, err = main(list(map(str, argv))), capsys.readouterr().err
        assert code == 2 and f"{holed / 'results.jsonl'} is incomplete: task niah_single_1, item 0 lacks the rows of " \
                              "keydiff/flat p=0.5 question 0" in err, err


def test_an_empty_source_says_what_it_is(shards, tmp_path, capsys):
    code, err = _merge(capsys, shards[0], tmp_path / "nothing", out=tmp_path / "merged")
    assert code == 2 and "nothing: no such directory" in err and "an empty shard" in err and "leave it out" in err, err


def test_an_empty_shard_is_a_note_and_writes_nothing(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("an empty shard loaded the model"))
    out = tmp_path / "s2"
    code = main(["compare", "--model", str(model_dir), "--press", "keydiff", "--keep-fractions", "0.5", "--tasks",
                 "niah_single_1", "--n", "1", "--length", "300", "--shard", "2/3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and captured.err.count("error") == 0, captured.err
    assert "shard 2/3 holds no context: the run has 1 context(s)" in captured.out
    assert not (out / "summary.md").exists() and not (out / "results.jsonl").exists()


def test_zeros_after_the_rows_are_named_damage_not_a_cut_line(shards, tmp_path, capsys):
    """Probe 11: NUL bytes after a store's rows (what a crash leaves where blocks were never written) were called a
    last line cut short by a stopped run, to "rerun (it resumes)"; they are named as damage, by file and line."""
    zeroed = _copy(shards[1], tmp_path / "zeroed", lambda lines: [*lines, b"\0" * 4096])
    code, err = main(["verify", str(zeroed)]), capsys.readouterr().err
    line = len((shards[1] / "results.jsonl").read_bytes().splitlines()) + 1
    assert code == 2 and f"{zeroed / 'results.jsonl'}:{line}: holds NUL bytes, which no run writes" in err, err
    assert "cut short" not in err and "it resumes" not in err, err
