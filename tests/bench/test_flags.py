"""``bench compare``'s method flags: an empty or contradicting ``--methods`` / ``--press`` / ``--alloc`` is one clear
error before any work, spaces count alike in every list, and the refusal of an allocator that compares layers
names the presses that declare comparable scores."""

import pytest

import allocators
import presses
from bench.commands.cli import build_parser, main
from bench.commands.compare_command import methods_of
from presses.base import Press
from presses.selection import check_pair


@pytest.mark.parametrize("argv, message", [
    (["--methods", ""], "--methods is empty; give press/allocator pairs"),
    (["--methods", " , "], "--methods is empty; give press/allocator pairs"),
    (["--press", " "], "--press is empty"),
    (["--methods", "keydiff/flat", "--press", "snapkv"],
     "--methods keydiff/flat names the press and allocator of each pair; --press snapkv would be ignored"),
    (["--methods", "keydiff/flat", "--alloc", "pyramid"], "--alloc pyramid would be ignored"),
    (["--methods", "keydiff/flat", "--press", "", "--alloc", "flat"], "--press  and --alloc flat would be ignored"),
])
def test_empty_or_contradicting_method_flags_are_refused(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code = main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bench compare: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_spaces_count_alike_in_every_list():
    parsed = build_parser().parse_args(["compare", "--methods", " keydiff / flat ,snapkv/ pyramid", "--press",
                                        " snapkv , keydiff", "--alloc", "flat ,"])
    assert parsed.methods == ["keydiff/flat", "snapkv/pyramid"]
    assert parsed.press == ["snapkv", "keydiff"] and parsed.alloc == ["flat"]
    defaults = build_parser().parse_args(["compare"])
    assert defaults.methods is None and defaults.press is None and defaults.alloc is None


def test_methods_alone_run_exactly_their_pairs():
    given = build_parser().parse_args(["compare", "--methods", "keydiff/flat,snapkv/pyramid"])
    assert methods_of(given) == ([], [], ["keydiff/flat", "snapkv/pyramid"])
    assert methods_of(build_parser().parse_args(["compare"])) == (["gatesight"], ["flat"], [])


def test_the_global_refusal_names_the_presses_that_declare_comparable_scores(monkeypatch):
    class Comparable(Press):
        name = "comparable"
        comparable_scale = True

    monkeypatch.setitem(presses.PRESSES, Comparable.name, Comparable)
    declared = [name for name, cls in presses.PRESSES.items() if cls.comparable_scale]
    assert "gatesight" not in declared and {"kvzip", "comparable"} <= set(declared)
    with pytest.raises(ValueError) as refused:
        check_pair(presses.get("keydiff"), allocators.get("global"))
    assert str(refused.value).endswith(f"use it with a press whose scores share one scale: {', '.join(declared)}")
