"""The CI leaderboard's gate: the published default group holds every press and allocator the project registers
(that runs by its name alone), or the test fails naming the command that adds its rows."""

from dataclasses import dataclass

import pytest

import presses
from bench.reports.leaderboard_gate import NOT_YET, meant, missing, stale
from bench.store.project_modules import ROOT
from bench.store.result_store import open_stores
from presses import registry

pytestmark = pytest.mark.slow  # ~22 s: they read the whole collection (the fixture); CI's slow run holds them


@pytest.fixture(scope="module")
def published() -> list[dict]:
    return [row for store in open_stores([ROOT / "docs" / "results"]) for row in store.rows]


def test_the_default_models_group_holds_every_registered_method(published):
    gaps = missing(published)
    assert not gaps, "\n".join(gaps)
    # an exception is named with why, and only for what is meant but absent
    press_names, allocator_names = meant()
    assert set(NOT_YET) <= set(press_names) | set(allocator_names) and all(NOT_YET.values())
    assert {"gatesight", "snapkv", "kvzip", "keydiff", "triattention"} <= set(press_names)
    assert "perlayer" not in allocator_names  # it cannot run without its weights


def test_the_default_models_groups_are_of_this_checkouts_shared_code(published):
    gaps = stale(published)
    assert not gaps, "\n".join(gaps)
    # an edit of the runtime since: the gate names the group and the carry that brings it here
    edited = [{**row, "code": "0ld0c0de0000"} for row in published if row["model"] == "hybrid-byte-12l"]
    lines = stale(edited)
    assert lines and all("is of shared code 0ld0c0de0000" in line and "bench carry docs/results/hybrid-byte-12l-"
                         in line for line in lines)
    # an edit of one press: its own rows are named, the others' are not
    edited = [{**row, "method_code": "0ld0c0de0000"} if row["press"] == "snapkv" else row for row in published
              if row["model"] == "hybrid-byte-12l"]
    lines = stale(edited)
    assert {line.partition(":")[0] for line in lines} == {"snapkv/flat", "snapkv/adakv"}
    assert all("of its own code 0ld0c0de0000" in line and "bench compare --methods snapkv/" in line for line in lines)


def test_a_new_press_without_rows_fails_the_gate_naming_the_command(published, monkeypatch):
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))

    @dataclass
    class Newest(presses.Press):
        name = "newest"

        def score(self, context):
            return {}

    Newest.__module__ = "presses.newest"  # as a file of presses/ would register it
    presses.register(Newest)
    gaps = missing(published)
    assert len(gaps) == 1 and gaps[0].startswith("press newest has no rows") and \
        "bench compare --methods newest/flat" in gaps[0] and "bench publish results/newest" in gaps[0], gaps
