"""Recall windows (:mod:`hybridmodel.recall_windows`): every reply states what the window's text says of the key
asked, after the assistant's turn header; the text is training text only; the wording shares nothing with the
benchmark tasks of :mod:`workloads.tasks`; windows are deterministic in (seed, step, length) and varied."""

import ast
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import hybridmodel.recall_facts as facts
import hybridmodel.recall_windows as recall
from hybridmodel.distill_windows import Windows
from hybridmodel.recall_facts import FORMATS, JOINT, LEADS, OPENINGS
from hybridmodel.recall_windows import RecallWindows
from hybridmodel.tokenizer import build_tokenizer
from runtime import CHATML_ASSISTANT_TURN, encode_text

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = (recall, facts)
"""The generator's modules: the windows, and the facts and phrasings they are made of."""
BANNED = ("magic number", "special magic", "needle", "pass key", "passkey", "haystack")
"""Phrases of the benchmark's retrieval tasks that no recall window may use."""


def _documents(calls):
    """Training documents of English-like words (two of them repeated often enough to be the vocabulary's
    function words), held-out ones of digits: a window shows which split it read."""
    def documents(source, split="train", min_chars=400):
        calls.append((source, split))
        rng = random.Random(f"{source}:{split}")
        if split != "train":
            return tuple((f"/{source}/{split}/{k}", " ".join(str(rng.randint(0, 99)) for _ in range(300)))
                         for k in range(3))
        words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(4, 8))) for _ in range(400)]
        docs = []
        for k in range(6):
            lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(90)]
            docs.append((f"/{source}/{split}/{k}", "\n".join(lines)))
        return tuple(docs)
    return documents


@pytest.fixture
def corpus(monkeypatch):
    calls = []
    monkeypatch.setattr("hybridmodel.distill_windows.documents", _documents(calls))
    return calls


@pytest.fixture
def windows(corpus):
    tokenizer = build_tokenizer()
    return RecallWindows(tokenizer, Windows(tokenizer, "train", 64, seed=0), seed=3)


def _check(window, tokenizer, length):
    """Every invariant of one window, read back from its ids."""
    ids = window.ids[0].tolist()
    assert len(ids) == length
    assert ids[-len(encode_text(tokenizer, "<|im_end|>\n")):] == encode_text(tokenizer, "<|im_end|>\n")
    header = encode_text(tokenizer, CHATML_ASSISTANT_TURN)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    keys = [fact.key for fact in window.facts]
    assert len(set(keys)) == len(keys) >= 2
    assert not any(a != b and a in b for a in keys for b in keys)  # no key inside another
    for fact, (start, stop) in zip(window.facts, window.fact_spans):
        assert tokenizer.decode(ids[start:stop]).strip() == fact.text  # with its line break, where merged into it
        assert fact.key in fact.text and fact.value in fact.text
    context = tokenizer.decode(ids[:window.question_spans[0][0]])
    for question, (q_start, q_stop), (v_start, v_stop) in zip(window.asked, window.question_spans,
                                                              window.value_spans):
        fact = window.facts[question]
        assert fact.key in tokenizer.decode(ids[q_start:q_stop])
        # what the text says of the key: the one line of the context that names it
        lines = [line for line in context.split("\n") if fact.key in line]
        assert lines == [fact.text]
        assert tokenizer.decode(ids[v_start:v_stop]).strip() == fact.value and fact.value in lines[0]
        # the value is teacher-forced in an assistant turn: after its header, that turn not ended before it
        reply = max(r for r in window.reply_starts if r <= v_start)
        assert ids[reply - len(header):reply] == header and end not in ids[reply:v_start]
        assert q_stop <= reply
    return ids


@pytest.mark.parametrize("length", [512, 2048, 4096])
def test_every_reply_states_what_the_text_says_of_the_key_asked(windows, length):
    for step in range(40):
        _check(windows(step, length), windows.tokenizer, length)


def test_windows_depend_on_seed_step_and_length_only(windows, corpus):
    tokenizer = windows.tokenizer
    again = RecallWindows(tokenizer, Windows(tokenizer, "train", 64, seed=9), seed=3)
    for step in range(10):
        assert torch.equal(windows(step, 2048).ids, again(step, 2048).ids)
    assert len({tuple(windows(step, 2048).ids[0].tolist()) for step in range(10)}) == 10
    other_seed = RecallWindows(tokenizer, Windows(tokenizer, "train", 64, seed=0), seed=4)
    assert not torch.equal(windows(0, 2048).ids, other_seed(0, 2048).ids)
    assert not torch.equal(windows(0, 2048).ids[:, :1024], windows(0, 1024).ids)


def test_the_text_is_the_training_split_of_the_training_sources_only(windows, corpus):
    """Documents are read through :class:`Windows` of the train split, of the training sources only; the text of
    a window (all but its facts and its end) holds no held-out character; a held-out Windows is refused; and the
    generator imports nothing that reads text (no corpus, no haystack, no benchmark task)."""
    from workloads.corpus import SOURCES

    tokenizer = windows.tokenizer
    assert set(corpus) == {(source, "train") for source in SOURCES}
    for step in range(30):
        window = windows(step, 2048)
        ids = window.ids[0].tolist()
        start, stop = window.text_span
        assert start <= window.fact_spans[0][0] and window.fact_spans[-1][1] <= stop <= window.question_spans[0][0]
        text_ids = [ids[k] for k in range(start, stop) if not any(a <= k < b for a, b in window.fact_spans)]
        assert not set(tokenizer.decode(text_ids)) & set("0123456789")
    with pytest.raises(ValueError, match="training text only, not of the 'heldout' split"):
        RecallWindows(tokenizer, Windows(tokenizer, "heldout", 64, seed=0), seed=0)
    nodes = [node for module in GENERATOR for node in ast.walk(ast.parse(Path(module.__file__).read_text()))]
    imported = {node.module for node in nodes if isinstance(node, ast.ImportFrom)} | \
        {alias.name for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    assert imported <= {"__future__", "random", "re", "string", "collections", "dataclasses", "typing", "torch",
                        "runtime", "runtime.errors", "recall_facts"}


def _strings(path: Path, skip: tuple[str, ...] = ()) -> list[list[str]]:
    """The string literals of a module but its docstrings (and the assignments to ``skip``), each as its pieces
    between placeholders (``{...}`` of str.format, an f-string's expressions)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    skipped = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id in skip for t in node.targets) for inner in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in skipped:
            continue
        if isinstance(node, ast.JoinedStr):
            pieces = [part.value for part in node.values if isinstance(part, ast.Constant)]
            out.append([p for piece in pieces for p in re.split(r"\{[^}]*\}", piece)])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(re.split(r"\{[^}]*\}", node.value))
    return out


def _grams(pieces: list[str], n: int = 4) -> set[tuple[str, ...]]:
    grams = set()
    for piece in pieces:
        words = re.findall(r"[a-z0-9']+", piece.lower())
        grams |= {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
    return grams


def _benchmark_grams() -> set[tuple[str, ...]]:
    tasks = ROOT / "workloads" / "tasks"
    grams = set()
    for path in sorted(tasks.glob("*.py")):
        for pieces in _strings(path):
            grams |= _grams(pieces)
    return grams


def test_no_template_shares_four_words_with_the_benchmark_tasks():
    """Every string of the generator (its docstrings aside, and the list of words it refuses to draw) against every
    string of workloads/tasks (RULER, SCBench, their haystack text and QA documents): no 4-word sequence in common,
    none of the benchmark's retrieval phrases; at least 8 formats, each with several phrasings."""
    benchmark = _benchmark_grams()
    assert len(benchmark) > 100  # the templates were read
    ours = [pieces for module in GENERATOR for pieces in _strings(Path(module.__file__), skip=("_BANNED",))]
    assert ours
    for pieces in ours:
        assert not _grams(pieces) & benchmark, pieces
        assert not any(phrase in " ".join(pieces).lower() for phrase in BANNED), pieces
    assert len(FORMATS) >= 8
    assert all(min(len(f.facts), len(f.questions), len(f.replies)) >= 3 for f in FORMATS.values())
    assert all(len(options) >= 3 for options in (OPENINGS, LEADS, JOINT))


def test_no_window_shares_four_words_with_the_benchmark_tasks(windows):
    """The same of what windows show around the training text: their openings, facts, questions and replies."""
    benchmark = _benchmark_grams()
    tokenizer = windows.tokenizer
    for step in range(150):
        window = windows(step, 2048 if step % 2 else 4096)
        ids = window.ids[0].tolist()
        shown = [tokenizer.decode(ids[:window.text_span[0]]), tokenizer.decode(ids[window.text_span[1]:])]
        shown += [tokenizer.decode(ids[start:stop]) for start, stop in window.fact_spans]
        for text in shown:
            assert not _grams([text]) & benchmark, text
            assert not any(phrase in text.lower() for phrase in BANNED), text


def test_windows_vary_as_the_recipe_asks(windows):
    """Over 300 windows: every format; two facts at least and many at 4,096 tokens; one question, several in one
    turn and several turns; the fact asked first is often not the last one in the text; facts at every depth."""
    kinds, counts, modes, not_last, depths = Counter(), Counter(), Counter(), 0, []
    for step in range(300):
        length = 2048 if step % 2 else 4096
        window = windows(step, length)
        kinds.update(fact.kind for fact in window.facts)
        counts[length, len(window.facts)] += 1
        modes["one" if len(window.asked) == 1 else "joint" if len(window.reply_starts) == 1 else "turns"] += 1
        not_last += window.asked[0] != len(window.facts) - 1
        depths += [start / length for start, _ in window.fact_spans]
    assert set(kinds) == set(FORMATS)
    assert min(n for _, n in counts) >= 2 and max(n for (length, n) in counts if length == 4096) >= 8
    assert min(modes["one"], modes["joint"], modes["turns"]) >= 30
    assert not_last >= 150
    assert all(any(low <= d < low + 0.2 for d in depths) for low in (0.0, 0.2, 0.4, 0.6))


@pytest.mark.realmodel
def test_the_teacher_forced_tokens_are_how_smollm2_encodes_the_whole_text(corpus):
    """Pieces encoded apart (so that a value's tokens are exactly its own) are the tokens SmolLM2's tokenizer gives
    the whole end of the window and each fact line: the teacher reads its own tokenisation."""
    from transformers import AutoTokenizer

    import pretrained

    directory = pretrained.installed(pretrained.CHECKPOINTS["smollm2-135m-instruct"])
    if directory is None:
        pytest.skip("smollm2-135m-instruct is not fetched: run `bench fetch-model smollm2-135m-instruct` once")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    windows = RecallWindows(tokenizer, Windows(tokenizer, "train", 64, seed=0), seed=1)
    for step in range(60):
        window = windows(step, 2048)
        ids = _check(window, tokenizer, 2048)
        end = ids[window.text_span[1]:]
        assert encode_text(tokenizer, tokenizer.decode(end)) == end
        user = ids[:window.fact_spans[-1][1]]  # the turn up to its last fact
        assert encode_text(tokenizer, tokenizer.decode(user)) == user
