"""A method's label is what reports show and folders are named after: text a label cannot show is refused as the
options are read, and each label has a folder of its own (probe 14, item 8)."""

import gzip
import json
from dataclasses import dataclass

import pytest

import presses
from bench.run.methods import methods_of
from bench.run.settings import CompareSettings
from bench.store.collection import method_folder
from bench.store.project_modules import ROOT
from runtime.errors import UsageError


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


@pytest.mark.parametrize(("tag", "char", "at"), [("a|b", "|", 2), ("a\nb", "\n", 2), ("a\tb", "\t", 2),
                                                 ("a\u200bb", "\u200b", 2), ("x/y", "/", 2), ("x;y", ";", 2)])
def test_text_a_label_cannot_show_is_refused_naming_the_option(tagp, tag, char, at):
    """``|`` added a column to each Markdown table row of the method, a newline split the row in two; ``/`` and
    ``;`` would read back as another method or a list (``bench carry`` reads labels back)."""
    given = f"tagp[tag={tag}]"
    with pytest.raises(UsageError) as refused:
        _labels([f"{given}/flat"])
    assert str(refused.value) == (
        f"--methods {given!r}: option tag={tag!r} holds {char!r} at character {at}, which its label cannot show as "
        "it is: a text option that a label shows is printable characters (no control characters), without '|' or "
        "the label's own '/', ',', ';', '[', ']'")


def test_text_given_as_a_library_option_is_held_to_the_same_rule(tagp):
    with pytest.raises(UsageError, match=r"option tag='x,y=z' holds ','"):
        _labels(["tagp/flat"], tag="x,y=z")


def test_text_a_label_shows_is_still_taken(tagp):
    assert _labels(["tagp[tag=a_b]/flat", "tagp[tag=a b (2)]/flat", "tagp[tag=é=1]/flat", "tagp/flat"]) == [
        "tagp(tag=a_b)/flat", "tagp(tag=a b (2))/flat", "tagp(tag=é=1)/flat", "tagp/flat"]


def _row(label: str) -> dict:
    press, _, allocator = label.partition("/")
    return {"press": press, "allocator": allocator}


def test_each_label_has_a_folder_of_its_own():
    """``tagp(tag=a|b)``, ``tagp(tag=a\\nb)`` and ``tagp(tag=a_b)`` were published into one file; so were a press
    named like a slug and the label slugged (``a_k_v_`` and ``a(k=v)``), and ``a--b/c`` and ``a/b--c``."""
    labels = ["tagp(tag=a|b)/flat", "tagp(tag=a\nb)/flat", "tagp(tag=a_b)/flat", "tagp(tag=a b)/flat",
              "gatesight(estimator=46e464d1a968)/global", "gatesight_estimator_46e464d1a968_/global",
              "kvpress:KnormPress/flat", "kvpress_KnormPress/flat", "a--b/c", "a/b--c", "p/b", "p/b_",
              "snapkv/perlayer(weights=1;2)", "snapkv/perlayer_weights_1_2", "x/y-0123456789"]
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
