"""The ``bench`` CLI assembled from its commands, and the library functions behind ``bench verify`` and
``bench calibrate``."""

import json
import shutil

import pytest
import torch

import allocators
import presses
from bench.commands.cli import COMMANDS, build_parser, main
from bench.reports.leaderboard import write_leaderboard
from bench.reports.verify import verify_stores
from bench.store.row_fields import RUN
from gatesight_learning.calibrate import calibrate_model
from pretrained import loading
from tests.helpers import published_rows


def test_every_command_is_in_the_parser_and_named_once():
    names = [command.name for command in COMMANDS]
    assert len(set(names)) == len(names)
    for name in names:
        required = {"verify": ["store"], "leaderboard": ["store"], "merge": ["store", "--out", "merged"],
                    "carry": ["store"], "publish": ["store"],
                    "fetch-model": ["smollm2-135m-instruct"], "ship-artifacts": ["smollm2-135m-hybrid"]}
        assert build_parser().parse_args([name, *required.get(name, [])]).command == name


@pytest.mark.parametrize("name", [command.name for command in COMMANDS])
def test_every_command_prints_its_help(name, capsys):
    """argparse formats help with ``%``: a help text's own ``%XX`` (the escapes of a text option) must be ``%%``."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([name, "--help"])
    assert stop.value.code == 0 and f"usage: bench {name}" in capsys.readouterr().out


def test_help_and_defaults_come_from_the_registries(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    assert f"comma list of allocators: {','.join(allocators.available())}" in " ".join(capsys.readouterr().out.split())
    cost = build_parser().parse_args(["cost"]).press
    for name in presses.PRESSES:  # every press the registry builds by its name alone, and only those
        if name in cost:
            presses.get(name)
        else:
            with pytest.raises(ValueError):
                presses.get(name)


@pytest.fixture
def small_store(tmp_path):
    """Two items of every task of the committed store, as a store of their own: quick to rebuild a leaderboard of.
    Rows that record their run (:data:`~bench.store.row_fields.RUN`) are made rows of a whole run of those two items."""
    rows = [row for row in published_rows() if row["item"] < 2]
    for row in rows:
        if RUN in row:
            row[RUN] = {**row[RUN], "n": 2, "shard": 0, "shards": 1}
    store = tmp_path / "store"
    store.mkdir()
    (store / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return store, len(rows)


@pytest.mark.slow  # it rebuilds the leaderboard twice (~35 s): CI's slow run holds it
def test_verify_stores_reports_each_check_and_refuses_a_stale_leaderboard(small_store, tmp_path):
    store, count = small_store
    lines = []
    verify_stores([store], report=lines.append)
    assert lines == [f"{count} rows complete, every value of its type and range; every no-prune row has ΔNLL = KL = 0, "
                     "every child's ΔNLL its NLL − the full cache's"]
    docs = tmp_path / "docs"
    write_leaderboard([store], docs)
    lines.clear()
    verify_stores([store], docs, report=lines.append)
    assert lines[1] == f"{docs / 'leaderboard.md'} is exactly what the store rebuilds"
    (docs / "leaderboard.md").write_text("# edited by hand\n")
    with pytest.raises(ValueError, match="is not what the store says; it was edited by hand since it was built: move "
                                         "it aside"):
        verify_stores([store], docs, report=lines.append)
    with pytest.raises(ValueError, match="empty: no such directory"):
        verify_stores([tmp_path / "empty"])


def test_calibrate_model_refuses_empty_work_before_loading(monkeypatch):
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("loaded the model before checking"))
    for tokens, chunk, flag in ((0, 128, "--tokens 0"), (300, 0, "--chunk 0")):
        with pytest.raises(ValueError, match=f"{flag}: give a positive number of tokens"):
            calibrate_model(None, tokens, chunk)
    for tokens in (1, 127):  # statistics of a handful of tokens: refused, the minimum named
        with pytest.raises(ValueError, match=f"--tokens {tokens}: give at least 128 "):
            calibrate_model(None, tokens, 128)


def test_calibrate_model_refuses_more_tokens_than_the_corpus_holds(model_dir, tmp_path, monkeypatch):
    import gatesight_learning.calibrate as calibrate_module

    corpus = [torch.arange(100), torch.arange(50)]
    monkeypatch.setattr(calibrate_module, "recording_chunks", lambda tokenizer, tokens, chunk: (corpus, ["a"]))
    monkeypatch.setattr(calibrate_module, "calibrate", lambda *a, **k: pytest.fail("calibrated before checking"))
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    before = sorted(p.name for p in copy.rglob("*"))
    with pytest.raises(ValueError, match="--tokens 300: the recording corpus holds 150 tokens for this tokenizer; "
                                         "give --tokens 150 or fewer"):
        calibrate_model(str(copy), 300, 128, replace=True)
    assert sorted(p.name for p in copy.rglob("*")) == before


def test_calibrate_model_stores_the_calibration_with_the_model(model_dir, tmp_path):
    from presses.calibration import FILE, Calibration

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    (copy / FILE).unlink()
    result, path = calibrate_model(str(copy), 300, 128)
    assert path == copy / FILE and Calibration.load(copy).gate_weights == result.gate_weights
    assert main(["calibrate", "--model", str(copy), "--tokens", "0"]) == 2
