"""Which text serves what (workloads.corpus): haystacks never share a document with anything that trains, calibrates
or labels; the plain-text readers of each format; real-text haystack tasks."""

import random

import pytest

from bench.run.compare import CompareSettings, plan, run_compare
from workloads.corpus import (
    ALL_SOURCES,
    HAYSTACK_SOURCES,
    LABEL_SOURCES,
    SOURCES,
    _markdown_prose,
    _roff_text,
    content_digest,
    documents,
    label_documents,
)
from workloads.haystacks import SENTENCES_PER_DOCUMENT, check_haystack, prose_sentences, snapshot
from workloads.haystacks import sentences as real_sentences
from workloads.tasks import Config, generate
from workloads.tasks.ruler import GENERATED, HAYSTACK_TASKS, TASKS


def test_roles_are_declared_once_and_cover_every_source():
    assert set(SOURCES) <= set(LABEL_SOURCES)
    assert not set(LABEL_SOURCES) & set(HAYSTACK_SOURCES)
    assert set(LABEL_SOURCES) | set(HAYSTACK_SOURCES) == set(ALL_SOURCES)


def test_no_haystack_document_is_read_by_training_calibration_or_labelling():
    # everything that trains the model, calibrates, times or labels reads documents of LABEL_SOURCES (either
    # split); a haystack document must be none of them, by path or by content (whitespace ignored)
    trained = {s: documents(s, "all") for s in LABEL_SOURCES}
    paths = {path for docs in trained.values() for path, _ in docs}
    digests = {content_digest(text) for docs in trained.values() for _, text in docs}
    prose = {prose_sentences(text)[:SENTENCES_PER_DOCUMENT] for docs in trained.values() for _, text in docs}
    for source in HAYSTACK_SOURCES:  # the shipped snapshots, and this machine's files of the source where it has them
        assert not {path for path, _ in snapshot(source)} & paths
        assert not {sentences for _, sentences in snapshot(source)} & prose, source
        haystack = documents(source, "all")
        assert not {path for path, _ in haystack} & paths
        assert not {content_digest(text) for _, text in haystack} & digests, source


def test_label_documents_hold_out_the_model_training_split():
    for source in SOURCES:
        assert set(label_documents(source)) == set(documents(source, "heldout"))
        assert not set(label_documents(source)) & set(documents(source, "train"))
    with pytest.raises(ValueError, match="not a labelling source"):
        label_documents("manpages")


def test_roff_and_markdown_readers_keep_the_prose():
    roff = ('.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH DESCRIPTION\nList information about the '
            '\\fBFILEs\\fR (the current directory by default).\n.TP\n\\fB\\-a\\fR, \\fB\\-\\-all\\fR\n.\\" comment\n'
            "do not ignore entries starting with .\n")
    text = _roff_text(roff)
    assert "ls - list directory contents" in text
    assert "List information about the FILEs (the current directory by default)." in text
    assert "-a, --all" in text and "comment" not in text and ".TH" not in text and "\\f" not in text
    markdown = "# Title\n\nSome prose here.\n\n```js\nconst x = 1;\n```\n\nMore prose.\n"
    assert _markdown_prose(markdown) == "# Title\n\nSome prose here.\n\n\n\nMore prose.\n"


def test_haystack_errors_name_the_choices():
    with pytest.raises(ValueError, match="unknown haystack 'wikipedia'; choose generated or one of manpages"):
        check_haystack("wikipedia")
    with pytest.raises(ValueError, match="unknown haystack"):
        generate("niah_single_2", 0, 0, Config(length=512, haystack="wikipedia"))
    with pytest.raises(ValueError, match="none of the tasks reads a haystack"):
        plan(CompareSettings(presses=["keydiff"], tasks=["vt"], haystack="manpages"))
    with pytest.raises(ValueError, match="unknown haystack"):
        plan(CompareSettings(presses=["keydiff"], tasks=["niah_single_2"], haystack="essays"))


@pytest.mark.parametrize("source", HAYSTACK_SOURCES)
def test_real_haystack_items(source):
    assert snapshot(source)
    for task in HAYSTACK_TASKS:
        item = generate(task, 3, 0, Config(length=768, haystack=source))
        again = generate(task, 3, 0, Config(length=768, haystack=source))
        generated = generate(task, 3, 0, Config(length=768))
        assert item.context == again.context and item.haystack == source and generated.haystack == GENERATED
        # same keys, values and questions as on the generated haystack: only the filler differs
        assert [q.text for q in item.questions] == [q.text for q in generated.questions]
        assert item.body != generated.body and len(item.context) > 400
        for question in item.questions:
            assert question.needles and all(sentence in item.body for sentence in question.needles)
            assert all(answer in " ".join(question.needles) for answer in question.answers)
    # tasks without an essay filler keep their own, whatever the option says
    for task in set(TASKS) - set(HAYSTACK_TASKS):
        if task.startswith("niah"):
            assert generate(task, 0, 0, Config(length=512, haystack=source)).haystack == GENERATED


def test_real_sentences_are_consecutive_sentences_of_documents():
    sentences = real_sentences("nodejs-docs", 30, random.Random(1))
    assert len(sentences) == 30 and sentences == real_sentences("nodejs-docs", 30, random.Random(1))
    corpus = {s for _, document in snapshot("nodejs-docs") for s in document}
    assert all(s in corpus for s in sentences)


@pytest.mark.slow  # ~3 s: two runs at 512 tokens; CI's slow run holds it
def test_haystack_runs_share_one_store_without_mixing(model_dir, tmp_path):
    """A real-text run and a generated run in one store: rows name their haystack, a task without an essay filler
    is shared (same key), and each run's summary rows are its own."""
    from bench.reports.stats import task_of
    from bench.run.compare import run_rows

    settings = {"presses": ["keydiff"], "keep_fractions": [0.5], "tasks": ["niah_single_1", "niah_single_2"], "n": 1,
                "length": 512, "model": str(model_dir), "out": tmp_path / "results"}
    real = CompareSettings(**settings, haystack="manpages")
    store = run_compare(real, show_progress=False)
    assert {(r["task"], r["haystack"]) for r in store.rows} == {("niah_single_1", GENERATED),
                                                               ("niah_single_2", "manpages")}
    before = len(store.rows)
    generated = CompareSettings(**settings)
    store = run_compare(generated, show_progress=False)
    assert len(store.rows) == before + 2  # only niah_single_2 on the generated haystack is new (baseline + keydiff)
    assert {task_of(r) for r in run_rows(store, real)} == {"niah_single_1", "niah_single_2@manpages"}
    assert {task_of(r) for r in run_rows(store, generated)} == {"niah_single_1", "niah_single_2"}
