"""A row is tied to what ran (probe 13, row 34): a store whose every row's length was edited alike passed verify, and
``bench publish`` put its 250-token contexts into the collection's group of 4096 tokens; one whose every row's model
was renamed was published as a section of that name with the default model's weights. Its context's size must fit
its length as the task builder fits one; rows of one model, item and length agree on their context's text, across
stores and codes; a collection names one fingerprint of weights by one model name. Each is refused by file and line,
the field and what it should be, before anything is written."""

import pytest

from bench.run.compare import run_compare
from bench.store.context_fit import fit_problem
from bench.store.store_checks import SHIPPED_DEFAULT
from pretrained.fingerprints import identity
from runtime.errors import UsageError
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows
from workloads.tasks.ruler import HAYSTACK_TASKS, PROFILES, TASKS, Config, answer_budget, generate


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """A finished run of the tiny model at 300 tokens: no prune and keydiff/flat on one context."""
    out = tmp_path_factory.mktemp("run")
    run_compare(compare_settings(model_dir, out), show_progress=False)
    return out


def _files(root):
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("length, expected", [(4096, "expected at least 3048 at length=4096"),
                                              (2048, "expected at least 1000 at length=2048"),
                                              (1024, "expected at least 333 at length=1024"),
                                              (180, "expected at most 155 at length=180")])
def test_every_row_given_a_length_its_context_never_fitted_is_refused(run, tmp_path, capsys, length, expected):
    rows = stored_rows(run)
    for row in rows:
        row["length"] = length
    bad = store_of(rows, tmp_path / "bad")
    n = rows[0]["n_context"]
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:1: n_context={n} ({expected}")
    collection = tmp_path / "results"
    collection.mkdir()
    code, err = run_cli(capsys, "publish", bad, "--into", collection)
    assert code == 2 and f"{bad / 'results.jsonl'}:1: n_context={n} ({expected}" in err, err
    assert list(collection.iterdir()) == []


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("task", TASKS)
def test_every_context_the_builder_makes_fits_its_length(task, profile):
    """The bounds hold of what the builder makes, at short and long lengths, with a byte-level count (the default
    model's: the most tokens a text can take) and on a real text's sentences where the task reads one."""
    count = lambda text: len(text.encode())  # noqa: E731
    built = 0
    for haystack in ("generated", "manpages") if task in HAYSTACK_TASKS else ("generated",):
        for length in (384, 1024, 4096, 8192):
            try:
                item = generate(task, 0, 0, Config(profile=profile, length=length, count_tokens=count,
                                                   haystack=haystack))
            except UsageError:  # a length too short for one unit of this task: no row is ever written at it
                continue
            row = {"task": task, "profile": profile, "length": length, "n_context": count(item.context)}
            assert fit_problem(row) is None, (haystack, fit_problem(row))
            assert row["n_context"] + answer_budget(task, profile) < length
            built += 1
    assert built >= 1


@pytest.mark.parametrize("task", TASKS)
def test_a_context_fitted_to_a_length_is_refused_at_twice_it(task):
    """Probe 14, #3: the least context was the smaller of a third of the room and the room less
    :data:`~bench.store.context_fit.FIT_SLACK`, negative below some 1050 tokens and 1357 tokens at 4096: a 300-token
    run relabelled 1024 and a 2048-token one relabelled 4096 passed. Each bound holds of every context the builder
    makes (test above), so the larger does: from 1024 tokens on, a context fitted to a length is shorter than the
    room less :data:`~bench.store.context_fit.FIT_SLACK` at twice it."""
    count = lambda text: len(text.encode())  # noqa: E731
    for length in (1024, 2048):
        try:
            item = generate(task, 0, 0, Config(profile="compact", length=length, count_tokens=count))
        except UsageError:  # too short for one unit of this task, or more than its haystack fills
            continue
        row = {"task": task, "profile": "compact", "length": length, "n_context": count(item.context)}
        assert fit_problem(row) is None
        problem = fit_problem({**row, "length": 2 * length})
        assert problem and problem.startswith(f"n_context={row['n_context']} (expected at least "), (length, problem)


def test_rows_of_one_context_agree_on_its_text_across_stores(model_dir, run, tmp_path, capsys):
    """A store edited to another length its context could have fitted (300 → 320 tokens) passes alone; beside a run
    at that length, or published into its group from another checkout's code, its rows contradict that run's."""
    at_320 = tmp_path / "at-320"
    run_compare(compare_settings(model_dir, at_320, length=320), show_progress=False)
    rows = stored_rows(run)
    for row in rows:
        row["length"] = 320
    moved = store_of(rows, tmp_path / "moved")
    assert run_cli(capsys, "verify", moved)[0] == 0
    real = stored_rows(at_320)[0]
    # the first of the context's size, protected prefix and digest that differ (a byte-level line of noise is longer
    # than 20 tokens, so the two contexts may be of one size)
    field = next(f for f in ("n_context", "protected", "context_sha") if rows[0][f] != real[f])
    code, err = run_cli(capsys, "verify", at_320, moved)
    assert code == 2 and err.endswith(
        f"{moved / 'results.jsonl'}:1: {field}={rows[0][field]!r} (expected {real[field]!r}, as "
        f"{at_320 / 'results.jsonl'}:1 holds: rows of {real['model']} (weights {real['weights']}) answer one text for "
        f"task niah_single_1, item 0, seed 0 (generated haystack) at length=320, whatever method or code answered it; "
        "one of the two was changed after it was written, or ran on another machine's text: restore it, or publish it "
        "apart)"), err
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", at_320, "--into", collection)[0] == 0
    before = _files(collection)
    for row in rows:  # another checkout's run: its keys are not the collection's, its contexts still are
        row["code"] = "0" * 12
    other_code = store_of(rows, tmp_path / "other-code")
    code, err = run_cli(capsys, "publish", other_code, "--into", collection)
    assert code == 2 and "would not verify, so nothing was written" in err, err
    assert f"{field}={rows[0][field]!r} (expected {real[field]!r}, as {collection}/" in err, err
    assert _files(collection) == before


def test_a_collection_names_one_fingerprint_by_one_model(model_dir, run, tmp_path, capsys):
    """The name most of the collection's rows of those weights give is the one expected: a renamed store published
    into it is named, not the collection's own rows."""
    published, collection = tmp_path / "published", tmp_path / "results"
    run_compare(compare_settings(model_dir, published, n=2), show_progress=False)
    assert run_cli(capsys, "publish", published, "--into", collection)[0] == 0
    before = _files(collection)
    rows = stored_rows(run)
    original = rows[0]["model"]
    for row in rows:
        row["model"] = "smollm2-135m-instruct"
    renamed = store_of(rows, tmp_path / "renamed")
    assert run_cli(capsys, "verify", renamed)[0] == 0  # alone, no record says whose weights these are
    code, err = run_cli(capsys, "publish", renamed, "--into", collection)
    assert code == 2 and "would not verify, so nothing was written" in err, err
    assert "/smollm2-135m-instruct-300-" in err and ":1: model='smollm2-135m-instruct' (expected " \
        f"{original!r}, as 4 row(s) of the collection from {collection}/" in err, err
    assert f"name the model of weights {rows[0]['weights']}: one fingerprint of weights, config and tokenizer is " \
           "one model, published under one name; a row's model was changed after it ran, or the model ran under " \
           f"another name: rerun it as {original!r})" in err, err
    assert _files(collection) == before


def test_a_catalogued_name_with_the_shipped_default_models_fingerprint_is_refused(run, tmp_path, capsys):
    """Probe 14, U2: a plain store whose rows were renamed smollm2-135m-instruct, keeping the default model's
    fingerprint, passed verify and was published into a new collection under that name. One fingerprint covers a
    model's weights, config and tokenizer, and no catalogued checkpoint is the shipped default model."""
    shipped = identity(SHIPPED_DEFAULT)
    rows = [dict(row, model_parts=dict(shipped.parts), weights=shipped.weights) for row in stored_rows(run)]
    assert run_cli(capsys, "verify", store_of(rows, tmp_path / "own-name"))[0] == 0  # a plain store names it freely
    renamed = store_of([dict(row, model="smollm2-135m-instruct") for row in rows], tmp_path / "renamed")
    code, err = run_cli(capsys, "verify", renamed)
    assert code == 2 and err.endswith(
        f"{renamed / 'results.jsonl'}:1: model='smollm2-135m-instruct' (expected 'hybrid-byte-12l': its weights "
        f"{shipped.weights} are the shipped default model's, {SHIPPED_DEFAULT}, which is no catalogued checkpoint; "
        "the row's model was changed after it ran: restore it)"), err
