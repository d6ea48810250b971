"""A run reads its model directory once a process: ``bench compare`` opens the model's ``config.json`` once, reads
each weight file whole once (its fingerprint) and maps it once where it loads the model — the driver of ``--jobs``
and each of its workers alike (:class:`pretrained.model_info.ModelInfo`, made once and handed down)."""

import builtins
import io
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import safetensors
import transformers.modeling_utils

import bench.store.project_modules
from pretrained import file_reads, fingerprints, model_info
from pretrained.loading import DEFAULT_MODEL_DIR

from ..helpers import run_cli

COMPARE = ["compare", "--tasks", "niah_single_1", "--length", "384", "--methods",
           "snapkv/flat,gatesight/flat", "--keep-fractions", "0.5"]
WEIGHTS = "model.safetensors"

# installed in every process of a run (the driver and the workers it spawns) as its interpreter starts: each open
# of a file inside the model directory is one line "pid, how, name" of the log
COUNTING = """
import builtins, io, os, safetensors
from pathlib import Path

MODEL, LOG = Path(os.environ["COUNTED_MODEL"]), os.environ["COUNTED_LOG"]
opened, mapped = builtins.open, safetensors.safe_open


def note(path, how):
    if isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).parent == MODEL:
        with opened(LOG, "a") as log:
            log.write(f"{os.getpid()}\\t{how}\\t{Path(path).name}\\n")


def counted_open(file, *args, **kwargs):
    note(file, "open")
    return opened(file, *args, **kwargs)


def counted_safe_open(path, *args, **kwargs):
    note(path, "safe_open")
    return mapped(path, *args, **kwargs)


builtins.open = io.open = counted_open
safetensors.safe_open = counted_safe_open
"""


def _counting(monkeypatch) -> Counter:
    """``Counter`` of ``(how, file name)`` for the files of the default model's directory this process opens from
    now on (``open``: Python's open, through which pathlib reads; ``safe_open``: safetensors' mapping, as
    transformers loads weights)."""
    counts: Counter = Counter()
    opened, mapped = builtins.open, safetensors.safe_open

    def note(path, how):
        if isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).parent == DEFAULT_MODEL_DIR:
            counts[how, Path(path).name] += 1

    def counted_open(file, *args, **kwargs):
        note(file, "open")
        return opened(file, *args, **kwargs)

    def counted_safe_open(path, *args, **kwargs):
        note(path, "safe_open")
        return mapped(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(io, "open", counted_open)
    for module in (safetensors, transformers.modeling_utils):  # transformers holds its own name for it
        monkeypatch.setattr(module, "safe_open", counted_safe_open)
    return counts


def test_one_compare_opens_the_config_once_and_reads_the_weights_once(tmp_path, monkeypatch, capsys):
    """In one process: config.json read into the ModelInfo once (not again by transformers: the model and its
    tokenizer are built from the config as read), the weights read whole once for their fingerprint and mapped once
    as the model loads (the completeness check is made on the bytes the fingerprint read). The shipped model's file
    record (files.json) is checked on those same reads: each file's SHA-256 is taken from the read that served the
    fingerprint or the config (stop 68 left one more read of each)."""
    fingerprints._weights_digest.cache_clear()  # as a fresh process finds it
    file_reads.forget()
    counts = _counting(monkeypatch)
    checked = []
    monkeypatch.setattr(model_info, "check_json_files", lambda *args: checked.append(args))
    code, err = run_cli(capsys, *COMPARE, "--n", "1", "--out", tmp_path / "out")
    assert code == 0, err
    assert len(checked) == 1  # the JSON files transformers reads, parsed once a run (before the model loads)
    assert counts["open", "config.json"] == 1 and counts["open", "files.json"] == 1, counts
    assert counts["open", WEIGHTS] == 1 and counts["safe_open", WEIGHTS] == 1, counts


@pytest.mark.slow
def test_the_driver_and_each_worker_read_the_model_once(tmp_path):
    """``--jobs 2``: the driver reads the config and hashes the weights once (the shipped model's file record checked
    on the same reads) and loads no model; each worker receives what the driver read with the plan and only loads the
    weights (a stat tells it they are the files the driver hashed)."""
    site, log = tmp_path / "site", tmp_path / "opens.log"
    site.mkdir()
    (site / "sitecustomize.py").write_text(COUNTING)
    env = {"PYTHONPATH": f"{site}:{bench.store.project_modules.ROOT}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "COUNTED_MODEL": str(DEFAULT_MODEL_DIR), "COUNTED_LOG": str(log)}
    done = subprocess.run([sys.executable, "-m", "bench.entry", *COMPARE, "--n", "2", "--jobs", "2", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    by_process: dict[str, Counter] = {}
    for line in log.read_text().splitlines():
        pid, how, name = line.split("\t")
        by_process.setdefault(pid, Counter())[how, name] += 1
    driver = [c for c in by_process.values() if c["safe_open", WEIGHTS] == 0]
    workers = [c for c in by_process.values() if c["safe_open", WEIGHTS] == 1]
    assert len(driver) == 1 and len(workers) == 2, by_process
    assert driver[0]["open", "config.json"] == 1 and driver[0]["open", WEIGHTS] == 1, driver
    for counts in workers:
        assert counts["open", "config.json"] == 0 and counts["open", WEIGHTS] == 0, counts
