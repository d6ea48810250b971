"""A method's label that does not read back as itself — ``%20`` for a space, a lowercase ``%0a``, a raw ``|``, keys
out of order or given twice, a ``%`` that starts no escape — is refused by every reader of a store, naming its file,
line, the label, the option and the label this bench shows; beside its setting's own label it would read as a second
method of one setting, with a folder and table row of its own (probe 17, #4). So is a label of a press or allocator
registered here that reads back as text but names its setting otherwise than a run does: an option at its default,
one it has not, a number written otherwise, another name of its class, a raw ';' in a text (probe 18, #3; the run
room's check, :mod:`bench.run.label_settings`). Every label this bench writes reads back."""

from dataclasses import dataclass, field

import pytest

import allocators
import bench.commands.cli  # noqa: F401 - hands every store reader the run room's setting check, as `bench` does
import presses
from bench.run.compare import run_compare
from bench.run.methods import methods_of
from bench.run.settings import CompareSettings
from bench.store.label_read_back import read_back_problem
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows

OLDER_BENCH = ("If {key} is a text option, an older bench wrote it, which took a '%' in a text as itself (this one "
               "reads %XX as an escape and shows '%' as %25); if not, it was written by hand or by another tool, so "
               "its rows name no method a rerun here could match")
BY_HAND = "it was written by hand or by another tool"


@pytest.mark.parametrize("label", [
    "none", "flat", "keydiff", "kvpress:ExpectedAttentionPress", "gatesight(estimator=46e464d1a968)",
    "snapkv(kernel=3,window=8)", "perlayer(weights=1;2.5)", "tagp(tag= x )",
    "kvzip(suffix=<%7Cim_start%7C>assistant%0A)",
    "tagp(tag=50%25 off)", "tagp(tag=a%3Bb)", "tagp(count=3,tag=x)", "tagp(tag=)",
])
def test_a_label_this_bench_writes_reads_back(label):
    assert read_back_problem(label, _kind(label)) is None


@pytest.mark.parametrize(("label", "problem"), [
    ("tagp(tag=50%25%20off)", "its tag '50%25%20off' is no text this bench shows (read as escapes it is '50% off', "
                              f"which this bench shows as '50%25 off'). {OLDER_BENCH.format(key='tag')}"),
    ("tagp(tag=a%0a)", "its tag 'a%0a' is no text this bench shows (read as escapes it is 'a\\n', which this bench "
                       f"shows as 'a%0A'). {OLDER_BENCH.format(key='tag')}"),
    ("tagp(tag=%G1)", "its tag '%G1' is no text this bench shows (the '%' at character 1 starts no %XX escape). "
                      f"{OLDER_BENCH.format(key='tag')}"),
    ("perlayer(weights=1;x%41)", "its weights '1;x%41' is no text this bench shows (read as escapes it is '1;xA', "
                                 f"which this bench shows as '1;xA'). {OLDER_BENCH.format(key='weights')}"),
    # probe 21, U3: a '%' in a number option was blamed on an older bench alone (this room reads no option types)
    ("snapkv(window=%31%36)", "its window '%31%36' is no text this bench shows (read as escapes it is '16', which "
                              f"this bench shows as '16'). {OLDER_BENCH.format(key='window')}"),
    ("tagp(count=2,tag=a|b)", f"its tag 'a|b' is no text this bench shows (it shows that text as 'a%7Cb'); {BY_HAND}, "
                              "and this bench shows that setting as 'tagp(count=2,tag=a%7Cb)'"),
    ("tagp(tag=x,count=2)", f"its options are not in the order of their keys (tag, count); {BY_HAND}, and this bench "
                            "shows that setting as 'tagp(count=2,tag=x)'"),
    ("tagp(tag=x,tag=y)", f"its option tag is given 2 times, where this bench shows each option once; {BY_HAND}"),
    ("(tag=x)", f"it names no press or allocator before its options; {BY_HAND} (this bench writes no such label)"),
    ("tagp()", f"its brackets hold no options; {BY_HAND}"),
    ("tagp(tag=x", "its options have no closing ')'"),
    ("tagp(tag)", "its option 'tag' is no key=value pair of a field name and its value"),
    ("tag|p", "its name 'tag|p' is neither a registered name"),
])
def test_a_label_that_does_not_read_back_is_named_with_why_and_its_setting_label(label, problem):
    said = read_back_problem(label, _kind(label))
    assert said.startswith(f"the label {label!r} cannot be read back: ") and problem in said, said
    assert said.endswith("so its rows name no method a rerun here could match"), said


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat at p = 0.5 on one context."""
    out = tmp_path_factory.mktemp("run")
    run_compare(compare_settings(model_dir, out), show_progress=False)
    return out


def _relabelled(run, directory, label: str):
    """A store of ``run``'s rows with keydiff's label replaced by ``label``."""
    return store_of([{**row, "press": label} if row["press"] == "keydiff" else row for row in stored_rows(run)],
                    directory)


def test_a_store_naming_a_label_that_does_not_read_back_is_refused(run, tmp_path, capsys):
    # the setting's own label passes: only the one that does not read back as itself is refused
    assert run_cli(capsys, "verify", _relabelled(run, tmp_path / "good", "tagp(tag=50%25 off)"))[0] == 0
    label = "keydiff(tag=50%25%20off)"
    bad = _relabelled(run, tmp_path / "bad", label)
    at = next(i for i, row in enumerate(stored_rows(bad)) if row["press"] == label) + 1
    assert_reports_refuse(capsys, bad, tmp_path / "docs", (
        f"{bad / 'results.jsonl'}:{at}: press: the label {label!r} cannot be read back: its tag '50%25%20off' is no "
        "text this bench shows (read as escapes it is '50% off', which this bench shows as '50%25 off'). "
        f"{OLDER_BENCH.format(key='tag')} (expected a label as this bench writes it: rerun that method into a store "
        "of its own, or move its rows out)"))
    code, err = run_cli(capsys, "merge", run, bad, "--out", tmp_path / "merged")
    assert code == 2 and f"{bad / 'results.jsonl'}:{at}: press: the label {label!r}" in err, err


def test_the_store_shows_text_as_a_run_does():
    """The store room writes :func:`bench.run.specs.shown_text`'s rule again (it imports no other room): one answer
    over ASCII, Latin, CJK, combining marks, emoji, separators, controls and surrogates."""
    from bench.run import specs
    from bench.store import label_read_back

    sample = "".join(map(chr, [*range(0, 0x250), 0x301, 0x2028, 0x202E, 0x3000, 0x65E5, 0xAD, 0x17B4, 0xD800,
                               0xE000, 0xFEFF, 0x1F604, 0x1FAE0, 0x1FAE8, 0x10FFFF]))
    assert [label_read_back.shown_text(c) for c in sample] == [specs.shown_text(c) for c in sample]
    assert label_read_back._ESCAPED == specs.ESCAPED and label_read_back._NOT_SHOWN == specs._NOT_SHOWN


def _kind(label: str) -> str:
    """The registry a test's label is of: an allocator's where its name is one, a press's otherwise."""
    return "allocator" if label.partition("(")[0] in allocators.ALLOCATORS else "press"


def _setting(shown: str) -> str:
    return f"{BY_HAND}, and this bench shows that setting as {shown!r}, so its rows name no method a rerun here " \
           "could match"


def _no_setting(why: str) -> str:
    """The start of what is said of a label no run builds a setting from, up to ``why`` (the rest of why is the
    registry's)."""
    return f"a run here builds no setting from it ({why}"


@pytest.mark.parametrize(("label", "problem"), [
    ("snapkv(gqa=mean,window=16)", _setting("snapkv(window=16)")),  # a default named
    ("snapkv(window=016)", _setting("snapkv(window=16)")),
    ("perlayer(weights=1;2.5;0.1)", _setting("perlayer(weights=10;25;1)")),  # perlayer normalises its weights
    ("perlayer(weights=10.0;25;1)", _setting("perlayer(weights=10;25;1)")),
    ("pyramid(beta=0.5,floor=4)", _setting("pyramid(beta=0.5)")),
    ("snapkv(windw=16)", _no_setting("read as the item 'snapkv[windw=16]': snapkv has no option 'windw'; valid: "
                                     "window, kernel, gqa")),
    ("snapkv(window=16;16)", _no_setting("read as the item 'snapkv[window=16/16]': snapkv option window='16/16': "
                                         "expected an integer")),
    ("perlayer", _no_setting("read as the item 'perlayer': perlayer needs its weights")),
    # probe 21, #1: an option shown by its files' fingerprint is set aside, the rest of the label rebuilt
    ("gatesight(estimator=5067dc3bbd1c,signal_dtype=float32)", _setting("gatesight(estimator=5067dc3bbd1c)")),
    ("gatesight(estimator=5067dc3bbd1c,nope=1)", _no_setting("read as the item 'gatesight[nope=1]': gatesight has "
                                                             "no option 'nope'")),
    ("gatesight(estimator=xyz)", _no_setting("its estimator 'xyz' is no fingerprint of a folder's files, 12 hex "
                                             "digits")),
    ("triattention(calibration=0123456789ab,gqa=max)", _setting("triattention(calibration=0123456789ab)")),
])
def test_a_label_naming_a_registered_setting_otherwise_than_a_run_is_refused(label, problem):
    said = read_back_problem(label, _kind(label))
    assert said is not None and said.startswith(f"the label {label!r} cannot be read back: ") and problem in said, said
    assert BY_HAND in said and said.endswith("so its rows name no method a rerun here could match"), said


@pytest.mark.parametrize("label", [
    "snapkv(window=16)", "kvpress:KnormPress", "kvpress:SnapKVPress(window_size=16)", "adakv(safeguard=0.1)",
    "perlayer(weights=10;25;1)", "pyramid(beta=0.5)", "head_shares", "gatesight", "kvpress:TOVAPress",
    "gatesight(estimator=5067dc3bbd1c,signal_dtype=bfloat16)", "triattention(calibration=0123456789ab,gqa=mean)",
])
def test_a_label_of_a_registered_setting_as_a_run_writes_it_reads_back(label):
    assert read_back_problem(label, _kind(label)) is None


def test_another_name_of_a_kvpress_class_is_named_so():
    """Probe 21, #4: ``kvpress:knorm`` is a name an older bench wrote for ``KnormPress``, not one written by hand;
    as an allocator (no allocator is a kvpress class: probe 21, #5) it is refused by its text."""
    assert read_back_problem("kvpress:knorm", "press") == (
        "the label 'kvpress:knorm' cannot be read back: kvpress:knorm is another name of kvpress:KnormPress (an older "
        "bench wrote it so), and this bench shows that setting as 'kvpress:KnormPress', so its rows name no method a "
        "rerun here could match")
    said = read_back_problem("kvpress:knorm", "allocator")
    assert said.startswith("the label 'kvpress:knorm' cannot be read back: its name 'kvpress:knorm' is a kvpress "
                           "press's, and no allocator is named kvpress:<class>"), said


@pytest.mark.parametrize(("label", "kind"), [
    ("SnapKV(window=16)", "press"), ("Flat", "allocator"), ("FLAT", "allocator"), ("pyramid(tag=y)", "press"),
    ("snapkv(tag=y)", "allocator"),
])
def test_a_users_name_like_a_registered_one_is_read_as_text(label, kind):
    """Probe 19, #1: a user's press named as a registered one in another letter case (``SnapKV``), or as an
    allocator (``pyramid``), was rebuilt as the registered class and its rows refused as written by hand."""
    assert read_back_problem(label, kind) is None


def test_each_label_a_run_writes_reads_back():
    pairs = ["snapkv[window=16]/flat", "kvpress:knorm/flat", "keydiff/perlayer[weights=1/2.5/0.1]",
             "keydiff/pyramid[beta=0.5,floor=4]", "kvpress:SnapKVPress[window_size=16]/adakv[safeguard=0.1]",
             "snapkv[gqa=max,window=016]/global"]
    for method in methods_of(CompareSettings(presses=[], allocators=[], pairs=pairs), model=None):
        assert read_back_problem(method.press.label, "press") is None
        assert read_back_problem(method.allocator.label, "allocator") is None


@dataclass
class TagPress(presses.Press):
    """A press of the user's, with a text option and a real one."""

    name = "tagp"
    tag: str = "x"
    decay: float = 1.0

    def score(self, context):
        raise AssertionError("never scored here")


def _users(shown: str) -> str:
    """What is said of a user's press (a module outside the project's) whose label names its setting otherwise: its
    module may have changed since (probe 21, U1)."""
    return f"tagp as its module {__name__} is imported here shows that setting as {shown!r}: the module changed " \
           "since the label was written (a default or an option), or the label was written by hand"


@pytest.mark.parametrize(("label", "problem"), [
    ("tagp(tag=x;y%2Cz)", _users("tagp(tag=x%3By%2Cz)")),  # a raw ';' in a text is the text's own
    ("tagp(decay=1.0)", _users("tagp")),
    ("tagp(decay=2.50,tag=y)", _users("tagp(decay=2.5,tag=y)")),
    ("tagp(decay=0.00001)", _users("tagp(decay=1e-05)")),
    ("tagp(decay=)", _no_setting("read as the item 'tagp[decay=]': tagp option decay=''")),
])
def test_a_users_press_is_rebuilt_where_it_is_registered_and_read_as_text_where_not(monkeypatch, label, problem):
    assert read_back_problem(label, "press") is None  # a user's module not imported (verify imports none): text alone
    monkeypatch.setitem(presses.PRESSES, TagPress.name, TagPress)
    said = read_back_problem(label, "press")
    assert said is not None and problem in said, said
    assert read_back_problem("tagp(decay=2.5,tag=x%3By%2Cz)", "press") is None


def test_a_store_naming_a_registered_setting_otherwise_than_a_run_is_refused(run, tmp_path, capsys):
    label = "keydiff(normalized_anchor=False)"  # its default
    bad = _relabelled(run, tmp_path / "bad", label)
    at = next(i for i, row in enumerate(stored_rows(bad)) if row["press"] == label) + 1
    assert_reports_refuse(capsys, bad, tmp_path / "docs", (
        f"{bad / 'results.jsonl'}:{at}: press: the label {label!r} cannot be read back: {_setting('keydiff')} "
        "(expected a label as this bench writes it: rerun that method into a store of its own, or move its rows out)"))
    code, err = run_cli(capsys, "merge", run, bad, "--out", tmp_path / "merged")
    assert code == 2 and f"{bad / 'results.jsonl'}:{at}: press: the label {label!r}" in err, err


def test_the_bench_command_hands_the_store_its_check_of_settings():
    """The store room imports no other room (tests/test_import_graph.py): the command hands every reader of a store
    the run room's rebuild of a registered label's setting, which decides no value and is in no group's code."""
    from bench.run.label_settings import setting_problem
    from bench.store import label_read_back
    from bench.store.code_version import result_modules

    assert label_read_back._setting_check is setting_problem
    assert "bench.run.label_settings" not in result_modules()


@dataclass
class UnitWeights(allocators.FlatAllocator):
    """A user's allocator that holds its weights scaled to sum 1: built again from what it holds, its floats move."""

    name = "unitw"
    weights: list[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self):
        total = sum(self.weights)
        self.weights = [w / total for w in self.weights]


@dataclass
class ArrayWeights(allocators.FlatAllocator):
    """A user's allocator that holds its weights as a numpy array, which no label shows."""

    name = "arrayw"
    weights: list[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self):
        import numpy

        self.weights = numpy.asarray(self.weights, numpy.float32)


@dataclass
class ArrayListWeights(allocators.FlatAllocator):
    """A user's allocator that holds its weights as a list of numpy arrays (probe 25, U1: named a list alone)."""

    name = "arraylw"
    weights: list[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self):
        import numpy

        self.weights = [numpy.asarray([w]) for w in self.weights]


@dataclass
class WholeLevel(allocators.FlatAllocator):
    """A user's allocator that holds its integer level as a float, which the label then shows as no integer."""

    name = "wholel"
    level: int = 1

    def __post_init__(self):
        self.level = float(self.level)


@dataclass
class NotFlag(allocators.FlatAllocator):
    """A user's allocator that holds the negation of the flag it is given."""

    name = "notf"
    flag: bool = False

    def __post_init__(self):
        self.flag = not self.flag


@dataclass
class ArrayPress(presses.Press):
    """A user's press that holds its weights as a numpy array (probe 23, #2: a traceback)."""

    name = "arrayp"
    weights: list[float] = field(default_factory=lambda: [1.0])

    def __post_init__(self):
        import numpy

        self.weights = numpy.asarray(self.weights)

    def score(self, context):
        raise AssertionError("never scored here")


@dataclass
class ClampedPress(presses.Press):
    """A user's press that clamps its level to 5: ``level=9`` and ``level=5`` are one setting."""

    name = "clampp"
    level: int = 1

    def __post_init__(self):
        self.level = min(self.level, 5)

    def score(self, context):
        raise AssertionError("never scored here")


AGAIN = ("its __post_init__ changes its options again at each build, so no label names its setting; make a build "
         "from its own values keep them")
MOVES = ("its class changes its options as it is built (its __post_init__), so no label names its setting; make a "
         "build keep the values it is given, or give again the values it made (round them)")


@pytest.mark.parametrize(("method", "said"), [
    # probe 21, #2: compare ran the context, then refused its own row's label as written by hand
    ("keydiff/unitw[weights=0.15/0.15/0.1]", "allocator unitw: built from what it holds (weights=[0.37499999999999994,"
     " 0.37499999999999994, 0.25]), it holds weights=[0.375, 0.375, 0.25000000000000006]: " + AGAIN),
    # probe 23, #4: flag=true held False, the default build's True: two settings, one label
    ("keydiff/notf[flag=true]", "allocator notf: built from what it holds (flag=False), it holds flag=True: "
     + AGAIN),
    # probe 22, #4: a traceback comparing arrays
    ("keydiff/arrayw[weights=1/2]", "allocator arrayw: built, it holds weights as a numpy.ndarray, which no label "
     "shows: have its __post_init__ keep a number, a text, or a list of numbers"),
    ("keydiff/arraylw[weights=1/2]", "allocator arraylw: built, it holds weights as a builtins.list whose item 0 is "
     "a numpy.ndarray, which no label shows"),
    # probe 22, U1: the rebuild's own error, naming neither the allocator nor why
    ("keydiff/wholel[level=3]", "allocator wholel: built, it holds values its options do not take (wholel option "
     "level=3.0: expected an integer): have its __post_init__ keep each of its field's type"),
    # probe 22, #3: level=9 ran as a second label of level=5's setting
    ("clampp[level=9]/flat", "press clampp: given level=9, it holds level=5: " + MOVES),
    ("arrayp[weights=1/2]/flat", "press arrayp: built, it holds weights as a numpy.ndarray, which no label shows: "
     "have its __post_init__ keep a number, a text, or a list of numbers"),
])
def test_a_class_whose_options_move_as_it_is_built_is_refused_before_any_work(model_dir, tmp_path, capsys,
                                                                              monkeypatch, method, said):
    for cls in (UnitWeights, ArrayWeights, ArrayListWeights, WholeLevel, NotFlag):
        monkeypatch.setitem(allocators.ALLOCATORS, cls.name, cls)
    for cls in (ClampedPress, ArrayPress):
        monkeypatch.setitem(presses.PRESSES, cls.name, cls)
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", out, "--methods", method,
                        "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300")
    assert code == 2 and said in err and "\n" not in err, err
    assert not out.exists()
