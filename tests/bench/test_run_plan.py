"""One plan per run: ``name[key=value,...]`` gives a press or an allocator options of its own, typed by its fields;
rows name each method by its specs' labels (the format of the committed stores); every bad item is one clear error
naming it and what is allowed, before any model loads."""

import json
import re
import shutil

import pytest

from bench.commands.cli import main
from bench.run.compare import plan
from bench.run.specs import AllocatorSpec, Method, PressSpec, parse_item, parse_pair, split_items
from bench.store.result_store import ResultStore
from pretrained import loading
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli


def test_items_split_at_the_separators_outside_brackets():
    assert split_items(" snapkv[window=64,kernel=5] , keydiff,,perlayer[weights=1/2/3]", ",") == [
        "snapkv[window=64,kernel=5]", "keydiff", "perlayer[weights=1/2/3]"]
    assert parse_item("snapkv[window=64, kernel = 5]", "--press") == ("snapkv", {"window": "64", "kernel": "5"})
    assert parse_item("keydiff", "--press") == ("keydiff", {})
    # a list option's '/' inside brackets is not the pair's
    assert parse_pair("snapkv[window=8]/perlayer[weights=1/3]") == ("snapkv[window=8]", "perlayer[weights=1/3]")


@pytest.mark.parametrize("text, message", [
    ("snapkv[window=64", "--press 'snapkv[window=64': a '[' is not closed"),
    ("snapkv]", "--press 'snapkv]': a ']' without its '[' at character 7"),
    ("snapkv[window=[64]]", "a '[' inside brackets at character 15"),
    ("snapkv[window=64]x", "'x' after the options' ']'"),
    ("[window=64]", "no name before its options"),
    ("snapkv[window]", "'window' is not key=value"),
    ("snapkv[window=1,window=2]", "option 'window' given twice"),
])
def test_a_malformed_item_is_named(text, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_item(split_items(text, ",", "--press")[0], "--press")


def test_each_press_takes_its_own_options_typed_by_its_fields(model_dir, tmp_path):
    run = plan(compare_settings(model_dir, tmp_path, presses=["gatesight", "snapkv[window=8]",
                                                              "keydiff[normalized_anchor=yes]", "none"],
                                allocators=["flat", "perlayer[weights=1/3]"]))
    snapkv, keydiff = PressSpec("snapkv", (("window", 8),)), PressSpec("keydiff", (("normalized_anchor", True),))
    assert run.presses == (PressSpec("gatesight"), snapkv, keydiff)
    assert run.allocators == (AllocatorSpec("flat"), AllocatorSpec("perlayer", (("weights", (1.0, 3.0)),)))
    assert [m.label for m in run.methods] == [
        "gatesight/flat", "gatesight/perlayer(weights=1;3)", "snapkv(window=8)/flat",
        "snapkv(window=8)/perlayer(weights=1;3)", "keydiff(normalized_anchor=True)/flat",
        "keydiff(normalized_anchor=True)/perlayer(weights=1;3)"]
    assert run.children[0][0].label == "none" and len(run.children) == 1 + 6 * len(run.keep_fractions)
    # one press twice, configured two ways, is two methods
    two = plan(compare_settings(model_dir, tmp_path, presses=["snapkv[window=8]", "snapkv[window=16]"]))
    assert [m.press.label for m in two.methods] == ["snapkv(window=8)", "snapkv(window=16)"]
    pairs = plan(compare_settings(model_dir, tmp_path, presses=[], pairs=["snapkv[window=8]/perlayer[weights=1/3]",
                                                              "gatesight/gate"]))
    assert pairs.methods == (Method(snapkv, AllocatorSpec("perlayer", (("weights", (1.0, 3.0)),))),
                             Method(PressSpec("gatesight"), AllocatorSpec("gate")))


@pytest.mark.parametrize("change, message", [
    (dict(presses=["gatesight", "snapkv[windw=8]"]), "snapkv has no option 'windw'; valid: window, kernel, gqa"),
    (dict(presses=["snapkv[window=abc]"]), "snapkv option window='abc': expected an integer"),
    (dict(presses=["keydiff[normalized_anchor=maybe]"]), "expected true or false"),
    (dict(allocators=["perlayer[weights=a/b]"]), "perlayer option weights='a/b'"),
    (dict(presses=["gatesight", "snapkv"], press_options={"window": "8"}), "gatesight has no option 'window'"),
    (dict(presses=["snapkv[window=8]"], press_options={"window": "16"}),
     "option 'window' is given in its brackets and in --press-options too"),
    (dict(presses=["none[window=8]"]), "no prune (none) takes no options"),
    (dict(presses=["snapkv[window=8]", "snapkv[window=08]"]),
     "--press names one setting twice: 'snapkv[window=8]' and 'snapkv[window=08]'"),
    (dict(presses=[], pairs=["snapkv[window=8]/flat", "snapkv[window=08]/flat"]),
     "--methods names one setting twice: 'snapkv[window=8]/flat' and 'snapkv[window=08]/flat'"),
    (dict(presses=[], pairs=["snapkv[window=8]/perlayer[weights=1/3"]), "a '[' is not closed"),
    (dict(presses=[], pairs=["snapkv/"]), "expected press/allocator"),
])
def test_a_bad_option_is_refused_naming_it(model_dir, tmp_path, change, message):
    with pytest.raises(UsageError) as refused:
        plan(compare_settings(model_dir, tmp_path, **change))
    assert message in str(refused.value)


@pytest.mark.slow  # ~4 s: two runs; CI's slow run holds it
def test_per_press_options_on_the_command_line(model_dir, tmp_path, capsys):
    """``--press gatesight,snapkv[window=8]`` runs (``--press-options window=8`` is refused: gatesight has no
    window); an option in brackets gives the rows of the same option in ``--press-options``."""
    base = ["compare", "--model", model_dir, "--alloc", "flat", "--keep-fractions", "0.5", "--tasks", "niah_single_1",
            "--n", 1, "--length", 300]
    code, err = run_cli(capsys, *base, "--press", "gatesight,snapkv[window=8]", "--out", tmp_path / "both")
    assert code == 0, err
    assert {r["press"] for r in ResultStore(tmp_path / "both", readonly=True).rows} == {
        "none", "gatesight", "snapkv(window=8)"}
    timings = ("prefill_seconds", "score_seconds")

    def rows(out, *flags):
        code, err = run_cli(capsys, *base, *flags, "--out", tmp_path / out)
        assert code == 0, err
        return {(r["press"], r["question"]): {k: v for k, v in r.items() if k not in timings}
                for r in ResultStore(tmp_path / out, readonly=True).rows}

    own = rows("own", "--press", "snapkv[window=8]")
    assert {press for press, _ in own} == {"none", "snapkv(window=8)"}
    assert own == rows("every", "--press", "snapkv", "--press-options", "window=8")


@pytest.mark.parametrize("argv, message", [
    (["--press", "gatesight,snapkv[window=8"], "argument --press: 'gatesight,snapkv[window=8': a '[' is not closed"),
    (["--methods", "snapkv[window=8/flat"], "argument --methods: 'snapkv[window=8/flat': a '[' is not closed"),
    (["--press", "gatesight,snapkv", "--press-options", "window=8"], "gatesight has no option 'window'; valid: "),
    (["--alloc", "adakv[safeguard=abc]"], "adakv option safeguard='abc': expected a number"),
])
def test_bad_items_are_refused_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["--press", "snapkv,snapkv[window=32]"], "--press names one setting twice: 'snapkv' and 'snapkv\\[window=32\\]'"),
    (["--methods", "snapkv[window=32]/flat,snapkv/flat"],
     "--methods names one setting twice: 'snapkv\\[window=32\\]/flat' and 'snapkv/flat'"),
    (["--press", "snapkv", "--alloc", "flat,flat"], "--alloc names one setting twice: 'flat' and 'flat'"),
    (["--press", "kvpress:snapkv,kvpress:SnapKVPress"],
     "--press names one setting twice: 'kvpress:snapkv' and 'kvpress:SnapKVPress' \\(both are kvpress:SnapKVPress\\)"),
    (["--methods", "kvpress:KnormPress/flat,kvpress:knorm/flat"],
     "--methods names one setting twice: 'kvpress:KnormPress/flat' and 'kvpress:knorm/flat'"),
    (["--press", "kvpress:KnormPress[compression_ratio=0.9]"], "compression_ratio is kvpress's budget"),
    (["--press", "snapkv", "--press-options", "window=64,window=32"], "option 'window' is given twice"),
    (["--press", "snapkv", "--keep-fractions", "0.5,0.5000000001"],
     "kept fractions 0.5, 0.5000000001 are one fraction where reports show them \\(p = 0.5\\)"),
])
def test_one_setting_is_named_once(model_dir, tmp_path, capsys, no_model_load, argv, message):
    """Two names for one setting ran twice under two labels, or showed two columns no reader could tell apart."""
    code = main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_list_options_are_labelled_with_every_digit():
    """perlayer[weights=1.0000001/2] and perlayer[weights=1/2] are two settings: two labels (a store of one no
    longer resumes the other's rows); whole numbers stay as the committed stores show them."""
    assert AllocatorSpec("perlayer", (("weights", (1.0000001, 2.0)),)).label == "perlayer(weights=1.0000001;2)"
    assert AllocatorSpec("perlayer", (("weights", (1.0, 8.0)),)).label == "perlayer(weights=1;8)"


@pytest.mark.slow  # ~3 s: five plans; CI's slow run holds it
def test_an_option_at_its_default_is_the_setting_itself(model_dir, tmp_path):
    """snapkv[window=32] (SnapKV's default window) is snapkv: one label, so a store of one resumes the other's rows;
    a required option (perlayer's weights) stays."""
    def label(**change):
        return plan(compare_settings(model_dir, tmp_path, **change)).methods[0].label

    assert label(presses=["snapkv[window=32]"]) == label(presses=["snapkv"]) == "snapkv/flat"
    assert label(presses=["snapkv"], press_options={"window": "32"}) == "snapkv/flat"
    assert label(presses=["snapkv[window=8]"]) == "snapkv(window=8)/flat"
    assert label(presses=[], pairs=["snapkv/perlayer[weights=1/2]"]) == "snapkv/perlayer(weights=1;2)"


def test_an_option_given_twice_names_the_options_flag(model_dir, tmp_path):
    with pytest.raises(UsageError, match="given in its brackets and in --press-options too"):
        plan(compare_settings(model_dir, tmp_path, presses=[], pairs=["snapkv[window=64]/flat"],
                              press_options={"window": "64"}))
    with pytest.raises(UsageError, match="given in its brackets and in --alloc-options too"):
        plan(compare_settings(model_dir, tmp_path, presses=[], pairs=["snapkv/perlayer[weights=1/2]"],
                              alloc_options={"weights": "1/2"}))


@pytest.mark.slow  # ~4 s: six plans; CI's slow run holds it
def test_an_estimator_given_by_path_is_named_by_its_content(model_dir, tmp_path):
    """gatesight[estimator=DIR]: rows name the estimator's files by their fingerprint, not DIR, so that a store
    resumed after the files changed does not pass the old rows for the new estimator, and one estimator under two
    paths is one setting; the model's own estimator named by its path is the default, ``gatesight``."""
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(model_dir / "gatesight", first)
    config = json.loads((first / "gatesight.json").read_text())
    (first / "gatesight.json").write_text(json.dumps(config, indent=1))  # other bytes than the model's own
    shutil.copytree(first, second)

    def label(directory):
        return plan(compare_settings(model_dir, tmp_path / "out", presses=[f"gatesight[estimator={directory}]"])
                    ).methods[0].label

    fingerprint = loading.files_fingerprint(first, ("gatesight.json", "gatesight.safetensors"))
    assert label(first) == label(second) == f"gatesight(estimator={fingerprint})/flat"
    with pytest.raises(UsageError, match="names one setting twice"):
        plan(compare_settings(model_dir, tmp_path / "out",
                              presses=[f"gatesight[estimator={first}]", f"gatesight[estimator={second}]"]))
    (second / "gatesight.json").write_text(json.dumps(config, indent=3))
    assert label(second) != label(first)
    assert label(model_dir / "gatesight") == "gatesight/flat"
    with pytest.raises(UsageError, match="names one setting twice"):
        plan(compare_settings(model_dir, tmp_path / "out",
                              presses=["gatesight", f"gatesight[estimator={model_dir}/gatesight]"]))


@pytest.mark.slow  # ~3 s: four plans; CI's slow run holds it
def test_a_kvpress_short_name_is_labelled_by_the_class_it_names(model_dir, tmp_path):
    """kvpress:knorm is KnormPress() as its class builds it: one setting, labelled by the class, options too."""
    def label(press):
        return plan(compare_settings(model_dir, tmp_path, presses=[press])).methods[0].label

    assert label("kvpress:knorm") == label("kvpress:KnormPress") == "kvpress:KnormPress/flat"
    assert label("kvpress:snapkv[window_size=8]") == label("kvpress:SnapKVPress[window_size=8]") \
        == "kvpress:SnapKVPress(window_size=8)/flat"


def test_a_calibration_given_by_path_is_named_by_its_content(model_dir, tmp_path):
    """triattention[calibration=DIR] where DIR is the model's own directory, or the calibration folder in it (the
    older layout's place), is the default setting; another calibration is named by its content."""
    def label(directory):
        return plan(compare_settings(model_dir, tmp_path / "out", presses=[f"triattention[calibration={directory}]"])
                    ).methods[0].label

    assert label(model_dir) == label(model_dir / "calibration") == "triattention/flat"
    other = tmp_path / "other"
    shutil.copytree(model_dir / "calibration", other / "calibration")
    (other / "calibration" / "calibration.safetensors").write_bytes(
        (other / "calibration" / "calibration.safetensors").read_bytes())
    assert label(other) == "triattention/flat"  # the same bytes: the same calibration
    with pytest.raises(UsageError, match="names one setting twice"):
        plan(compare_settings(model_dir, tmp_path / "out",
                              presses=["triattention", f"triattention[calibration={other}]"]))


def test_an_estimator_option_naming_the_model_directory_points_to_its_folder(model_dir, tmp_path):
    with pytest.raises(UsageError, match=f"its gatesight/ folder holds one: give estimator='{model_dir}/gatesight'"):
        plan(compare_settings(model_dir, tmp_path / "out", presses=[f"gatesight[estimator={model_dir}]"]))


def test_perlayer_weights_of_one_ratio_are_one_setting(model_dir, tmp_path):
    """weights=1/2 and weights=2/4 split the budget alike: one label, and naming both is refused."""
    def label(weights):
        return plan(compare_settings(model_dir, tmp_path, presses=[], pairs=[f"snapkv/perlayer[weights={weights}]"])
                    ).methods[0].label

    assert label("2/4") == label("1/2") == label("0.5/1") == "snapkv/perlayer(weights=1;2)"
    assert label("0/3") == "snapkv/perlayer(weights=0;1)"
    with pytest.raises(UsageError, match="names one setting twice: 'snapkv/perlayer\\[weights=1/2\\]' and"):
        plan(compare_settings(model_dir, tmp_path, presses=[], pairs=["snapkv/perlayer[weights=1/2]",
                                                          "snapkv/perlayer[weights=2/4]"]))


def test_perlayer_without_weights_says_how_to_give_them(model_dir, tmp_path, capsys, no_model_load):
    code = main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--press", "snapkv",
                 "--alloc", "perlayer"])
    err = capsys.readouterr().err
    assert code == 2 and "perlayer needs its weights, one per attention layer: perlayer[weights=1/2/3]" in err, err
    assert "weights=[]" not in err


def test_pairs_beside_presses_are_refused_as_the_cli_refuses_them(model_dir, tmp_path):
    """The library dropped ``presses`` silently when ``pairs`` were given (the CLI refuses --methods beside
    --press): refused, naming what would be ignored; the default allocators (flat) are no conflict."""
    with pytest.raises(UsageError, match="pairs=\\['snapkv/flat'\\] name the press and allocator of each method; "
                                         "presses=\\['keydiff'\\] would be ignored"):
        plan(compare_settings(model_dir, tmp_path, presses=["keydiff"], pairs=["snapkv/flat"]))
    with pytest.raises(UsageError, match="allocators=\\['gate'\\] would be ignored"):
        plan(compare_settings(model_dir, tmp_path, presses=[], allocators=["gate"], pairs=["snapkv/flat"]))
    assert [m.label for m in plan(compare_settings(model_dir, tmp_path, presses=[], pairs=["snapkv/flat"])).methods] \
        == ["snapkv/flat"]
