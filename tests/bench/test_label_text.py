"""A method's label is what reports show and folders are named after: text a label cannot show as it is is shown as
``%XX`` escapes, which the command line takes too (probe 15, #3), and each label has a folder of its own (probe 14,
item 8)."""

import gzip
import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest

import allocators
import presses
from bench.commands.arguments import options
from bench.reports.leaderboard import _build
from bench.reports.report import summary_markdown
from bench.run.carry import _item
from bench.run.methods import methods_of
from bench.run.settings import CompareSettings
from bench.store.collection import method_folder
from bench.store.project_modules import ROOT
from bench.store.row_fields import method_of
from runtime.errors import UsageError
from tests.bench.test_leaderboard_page import _rows
from tests.helpers import run_cli


@dataclass
class TagPress(presses.Press):
    name = "tagp"
    tag: str = "x"

    def score(self, context):
        raise AssertionError("never scored here")


@pytest.fixture
def tagp(monkeypatch):
    monkeypatch.setitem(presses.PRESSES, TagPress.name, TagPress)


def _labels(pairs: list[str], **options) -> list[str]:
    settings = CompareSettings(presses=[], allocators=[], pairs=pairs, press_options=options)
    return [method.label for method in methods_of(settings, model=None)]


@pytest.mark.parametrize(("tag", "shown"), [
    ("a|b", "a%7Cb"), ("a\nb", "a%0Ab"), ("a\tb", "a%09b"), ("a\u200bb", "a%E2%80%8Bb"), ("x/y", "x%2Fy"),
    ("x;y", "x%3By"), ("x,y=z", "x%2Cy=z"), ("[x]", "%5Bx%5D"), ("50%", "50%25")])
def test_text_a_label_cannot_show_as_it_is_is_shown_escaped(tagp, tag, shown):
    """``|`` added a column to each Markdown table row of the method, a newline split the row in two; ``/`` and
    ``;`` would read back as another method or a list (``bench carry`` reads labels back). Such text was refused,
    which kept KVzip's ``suffix`` (a chat turn: ``<|im_start|>assistant``) from being set at all (probe 15, #3): it
    is shown as ``%XX`` escapes of its UTF-8 bytes instead, ``%`` itself too."""
    assert _labels(["tagp/flat"], tag=tag) == [f"tagp(tag={shown})/flat"]


def test_the_command_line_takes_the_escapes_a_label_shows(tagp):
    """An item's text option decodes ``%XX`` after the item is split (an escaped ',' splits no option), so that it is
    written as its label shows it; ``--press-options`` values are the command line's too; a library's text is taken
    as it is."""
    settings = CompareSettings(presses=[], allocators=[], pairs=["tagp[tag=a%7cb%2C c%0A]/flat"])
    (method,) = methods_of(settings, model=None)
    assert method.press.kwargs == {"tag": "a|b, c\n"} and method.label == "tagp(tag=a%7Cb%2C c%0A)/flat"
    assert options("tag=a%7Cb%2C c%0A") == {"tag": "a%7Cb%2C c%0A"}
    assert _labels(["tagp/flat"], tag=options("tag=a%7Cb%2C c%0A")["tag"]) == [method.label]
    assert _labels(["tagp/flat"], tag="a%7Cb") == ["tagp(tag=a%257Cb)/flat"]  # the library's '%' is a '%'


def test_kvzip_takes_a_chat_turn_from_the_command_line():
    """Its default turn, written with escapes, is its default (no option in the label); another model's turn is
    shown escaped."""
    assert _labels(["kvzip[suffix=<|im_end|>%0A<|im_start|>assistant%0A]/flat"]) == ["kvzip/flat"]
    assert _labels(["kvzip[suffix=<|eot_id|><|start_header_id|>assistant<|end_header_id|>%0A%0A]/flat"]) == [
        "kvzip(suffix=<%7Ceot_id%7C><%7Cstart_header_id%7C>assistant<%7Cend_header_id%7C>%0A%0A)/flat"]


@pytest.mark.parametrize(("tag", "bad"), [("50%", "the '%' at character 3 starts no %XX escape"),
                                          ("%zz", "the '%' at character 1 starts no %XX escape"),
                                          ("a%FFb", "its escapes %FF at character 2 are no UTF-8 text")])
def test_a_percent_that_starts_no_escape_is_refused_naming_the_value(tagp, tag, bad):
    given = f"tagp[tag={tag}]"
    with pytest.raises(UsageError) as refused:
        _labels([f"{given}/flat"])
    assert str(refused.value).startswith(f"--methods {given!r}: tagp option tag={tag!r}: {bad}")
    assert str(refused.value).endswith("write '%' itself as %25")


ALLOWED = ("text options take UTF-8 text, any character written as itself or as the %XX escapes of its UTF-8 bytes "
           "(%C3%A9 is 'é')")
"""What a refusal of a lone surrogate says is allowed."""


@pytest.mark.parametrize(("option", "refusal"), [
    ("prompt=a%ED%B3%BFb", "its escapes %ED%B3%BF at character 2 are no UTF-8 text: text options take %XX escapes of "
                           "UTF-8 bytes (%7C is '|', %C3%A9 is 'é'); write '%' itself as %25"),
    ("suffix=a\udcffb", "character 2 ('\\udcff') is no Unicode character but a lone surrogate (as a byte of the "
                        f"command line that is no UTF-8 is read): {ALLOWED}"),
])
def test_a_lone_surrogate_is_refused_on_the_command_line(option, refusal, model_dir, tmp_path, capsys, guarded):
    """Probe 16, #6: ``kvzip[prompt=a%ED%B3%BFb]`` (a lone surrogate's bytes), or a byte of argv that is no UTF-8
    (which Python reads as a lone surrogate, ``\\xff`` as ``\\udcff``), ended in the tokenizer's 58-line TypeError
    once the model had loaded: one line naming the option, the place and what is allowed, before any work."""
    given = f"kvzip[{option}]"
    key, _, value = option.partition("=")
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", f"{given}/flat", "--keep-fractions",
                        "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and err == f"bench compare: error: --methods {given!r}: kvzip option {key}={value!r}: {refusal}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["\udc80", "a\ud800", "é\udfff"])
def test_a_lone_surrogate_is_refused_where_a_library_types_options(tagp, text):
    """A library's text is typed as the command line's is: a press built with a lone surrogate in a text option is
    refused where its options are typed, naming the option and the place."""
    where = f"character {len(text)} ({text[-1]!r}) is no Unicode character but a lone surrogate"
    with pytest.raises(UsageError) as refused:
        presses.get("kvzip", prompt=text)
    assert str(refused.value).startswith(f"kvzip option prompt={text!r}: {where}") and ALLOWED in str(refused.value)
    with pytest.raises(UsageError, match=f"tagp option tag=.*: {re.escape(where)}"):
        _labels(["tagp/flat"], tag=text)


@dataclass
class LayersPress(presses.Press):
    """A user's press with a list of integers."""

    name = "layersp"
    layers: list[int] = field(default_factory=list)

    def score(self, context):
        raise AssertionError("never scored here")


@pytest.mark.parametrize("layers", [[10**16], [2**53 + 1], [2**53], [3, 10**20]])
def test_a_list_of_integers_is_shown_as_its_integers(monkeypatch, layers):
    """Probe 21, #3: entries were shown as floats, ``10**16`` as ``1e+16`` (which the list does not read back) and
    ``2**53 + 1`` as ``2**53`` (two settings, one label)."""
    monkeypatch.setitem(presses.PRESSES, LayersPress.name, LayersPress)
    item = f"layersp[layers={'/'.join(map(str, layers))}]/flat"
    (label,) = _labels([item])
    assert label == f"layersp(layers={';'.join(map(str, layers))})/flat"
    press, allocator = label.split("/")
    (method,) = methods_of(CompareSettings(presses=[], allocators=[], pairs=[f"{_item(press, [], lambda _: {})}/"
                                                                             f"{allocator}"]), model=None)
    assert method.label == label and method.press.kwargs == {"layers": layers}


def test_a_number_option_reads_no_escapes(tagp):
    with pytest.raises(UsageError, match=r"window='%36%34': expected an integer"):
        _labels(["snapkv[window=%36%34]/flat"])


@pytest.mark.parametrize("tag", ["a|b%c,d/e;f[g]h\ni", " both ends ", "%", "x=y", "(a)", "é\u200b"])
def test_a_label_reads_back_as_an_item_of_the_same_label(tagp, tag):
    """``bench carry`` reruns a method from its rows' label (:func:`bench.run.carry._item`): label -> item -> spec
    -> label is the identity, whatever the text holds (a space at either end, which an item's value loses as it is
    read, included)."""
    (label,) = _labels(["tagp/flat"], tag=tag)
    press, allocator = label.split("/")
    item = f"{_item(press, [], lambda _: {})}/{_item(allocator, [], lambda _: {})}"
    (method,) = methods_of(CompareSettings(presses=[], allocators=[], pairs=[item]), model=None)
    assert method.label == label and method.press.kwargs == {"tag": tag}


def test_text_a_label_shows_is_still_taken(tagp):
    assert _labels(["tagp[tag=a_b]/flat", "tagp[tag=a b (2)]/flat", "tagp[tag=é=1]/flat", "tagp/flat"]) == [
        "tagp(tag=a_b)/flat", "tagp(tag=a b (2))/flat", "tagp(tag=é=1)/flat", "tagp/flat"]


def _published_methods() -> set[str]:
    files = sorted((ROOT / "docs" / "results").glob("*/*/results.jsonl.gz"))
    assert files
    methods = set()
    for path in files:
        with gzip.open(path, "rt") as lines:
            methods |= {method_of(json.loads(line)) for line in lines}
    return methods


def test_every_published_label_is_shown_as_it_was():
    """A label shows escapes only for what it could not show before (then refused), and for ``%``, which no published
    label holds: each is byte for byte the label it was published under."""
    methods = _published_methods()
    assert methods and not any("%" in method for method in methods)


def test_a_label_with_an_escaped_bar_keeps_its_table_rows_whole(tmp_path):
    """Every row of a table of summary.md and leaderboard.md has its header's cells, the escaped method's too."""
    methods = {"none/none": 0.0, "tagp(tag=<%7Cim_start%7C>%0A)/flat": 0.2, "snapkv/flat": -0.1}
    rows = _rows(2048, methods, items=6)
    _build(rows, tmp_path, 50)
    for text in (summary_markdown(rows, resamples=50), (tmp_path / "leaderboard.md").read_text()):
        tables, previous = [], ""
        for line in text.splitlines():
            if line.startswith("|"):
                if not previous.startswith("|"):
                    tables.append([])
                tables[-1].append(line)
            previous = line
        assert any("tagp(" in line for table in tables for line in table)
        for table in tables:
            assert len({line.count("|") for line in table}) == 1, table


def _row(label: str) -> dict:
    press, _, allocator = label.partition("/")
    return {"press": press, "allocator": allocator}


def test_each_label_has_a_folder_of_its_own():
    """``tagp(tag=a|b)``, ``tagp(tag=a\\nb)`` and ``tagp(tag=a_b)`` were published into one file; so were a press
    named like a slug and the label slugged (``a_k_v_`` and ``a(k=v)``), and ``a--b/c`` and ``a/b--c``."""
    labels = ["tagp(tag=a|b)/flat", "tagp(tag=a\nb)/flat", "tagp(tag=a_b)/flat", "tagp(tag=a b)/flat",
              "gatesight(estimator=46e464d1a968)/global", "gatesight_estimator_46e464d1a968_/global",
              "kvpress:KnormPress/flat", "kvpress_KnormPress/flat", "a--b/c", "a/b--c", "p/b", "p/b_",
              "snapkv/perlayer(weights=1;2)", "snapkv/perlayer_weights_1_2", "x/y-0123456789",
              "tagp(tag=a%7Cb)/flat", "tagp(tag=..%2F..%0A)/flat"]
    folders = [method_folder(_row(label)) for label in labels]
    assert len(set(folders)) == len(labels)
    assert all(set(folder) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
               for folder in folders)
    assert folders[:3] == [f"tagp_tag_a_b_--flat-{digest}" for digest in ("53ac9186f9", "2fe62fb926", "8dded43712")]


def test_a_long_label_has_a_folder_name_a_file_system_takes():
    """Probe 15, #2: a 300-character option ended ``bench publish`` in ``OSError: File name too long``; a slug is cut
    at SLUG_LIMIT characters before its digest, and two labels alike in those characters still part."""
    from bench.store.collection import SLUG_LIMIT

    labels = [f"kvzip(prompt={'x' * 300})/flat", f"kvzip(prompt={'x' * 299}y)/flat"]
    folders = [method_folder(_row(label)) for label in labels]
    assert folders[0] != folders[1] and all(len(folder) == SLUG_LIMIT + 11 for folder in folders)
    assert method_folder(_row("keydiff/flat")) == "keydiff--flat"


def test_every_published_method_keeps_its_folder():
    """A folder of the published results is never renamed: each row's method folder is the one it lies in."""
    files = sorted((ROOT / "docs" / "results").glob("*/*/results.jsonl.gz"))
    assert files
    for path in files:
        with gzip.open(path, "rt") as lines:
            methods = {method_folder(json.loads(line)) for line in lines}
        assert methods == {path.parent.name}, path


@pytest.mark.parametrize("text, shown", [
    ("\U0001FAE8", "%F0%9F%AB%A8"),  # Unicode 15: escaped by Python 3.11, shown as itself by 3.12
    ("\U0001FAE0", "%F0%9F%AB%A0"),  # Unicode 14: escaped by 3.10 alone
    ("\U0001F604", "%F0%9F%98%84"),  # an emoji: newer than Unicode 3.2
    ("é e\u0301 日本 ß", "é e\u0301 日本 ß"),  # letters and a combining mark of 3.2, and the space, as they are
    ("\u00a0\u2028\u202e\ue000", "%C2%A0%E2%80%A8%E2%80%AE%EE%80%80"),
])
def test_what_a_label_escapes_is_the_same_under_every_python(text, shown):
    """Probe 18, #4: whether a character was shown as itself followed the Python's own Unicode version, so a label
    written under 3.12 was refused under 3.11 as written by hand (and the other way round); printable is now Unicode
    3.2's, which every Python ships."""
    from bench.run.specs import shown_text

    assert shown_text(text) == shown


@dataclass
class TablePress(presses.Press):
    """A user's press holding a table it makes itself in a field no one gives (probe 24, #1)."""

    name = "tablep"
    scale: float = 1.0
    table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.table = np.linspace(0, 1, 8) * self.scale

    def score(self, context):
        raise AssertionError("never scored here")


@dataclass
class TableAllocator(allocators.FlatAllocator):
    """The same as an allocator."""

    name = "tablea"
    scale: float = 1.0
    table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        self.table = np.linspace(0, 1, 8) * self.scale


def test_an_option_at_its_default_is_left_out_beside_a_field_holding_an_array(monkeypatch):
    """Probe 24, #1: two builds were compared whole, and a table made in ``__post_init__`` compares as no truth
    value (a traceback before any work); each option's held value is compared with the default build's."""
    monkeypatch.setitem(presses.PRESSES, TablePress.name, TablePress)
    monkeypatch.setitem(allocators.ALLOCATORS, TableAllocator.name, TableAllocator)
    assert _labels(["tablep[scale=1]/tablea[scale=1.0]", "tablep[scale=2]/tablea[scale=0.5]"]) == [
        "tablep/tablea", "tablep(scale=2.0)/tablea(scale=0.5)"]
