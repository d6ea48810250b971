"""SCBench: local loading, middle truncation, official scorers with their bugs, revised scorers, harness run."""

import json
import os

import pytest

from bench.run.compare import CompareSettings, run_compare
from runtime.errors import UsageError
from workloads.scbench_metrics import (
    official_any_upper,
    official_choice,
    official_qa_chn,
    parse_option,
    revised_choice,
    revised_qa_chn,
    score,
)
from workloads.tasks.scbench import load_rows, middle_truncate, to_item

ROWS = {
    "kv": [{"id": 0, "context": "{\"a1\": \"v-111\", \"b2\": \"v-222\", \"c3\": \"v-333\"} " * 3,
            "multi_turns": [{"input": "Key: \"b2\"\nThe value associated with the specified key is:",
                             "answer": "v-222"},
                            {"input": "Key: \"c3\"\nThe value associated with the specified key is:",
                             "answer": "v-333"}]}],
    "choice_eng": [{"id": 1, "context": "Alice met Bob in Paris. " * 10,
                    "multi_turns": [{"input": "Where did Alice meet Bob?", "answer": ["Paris", "B"],
                                     "options": ["London", "Paris", "Rome", "Oslo"]}]}],
}


@pytest.fixture
def scbench_dir(tmp_path):
    for task, rows in ROWS.items():
        (tmp_path / f"scbench_{task}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def test_qa_chn_official_bug_and_fix():
    # the official scorer iterates over the characters of a raw string label: an exact answer scores 2/(n+1)
    assert official_qa_chn("北京大学", "北京大学") == pytest.approx(2 / 5)
    assert revised_qa_chn("北京大学", "北京大学") == 1.0
    assert revised_qa_chn("是北京大学。", ["清华大学", "北京大学"]) == pytest.approx(2 * 0.8 * 1 / 1.8)


def test_choice_eng_official_bug_and_fix():
    label = ["Paris", "B"]
    assert official_choice("Answer: B", label) == 0.0  # first character 'A' read as the option
    assert official_choice("Based on the text, the answer is C", label) == 1.0  # 'B' of "Based"
    assert official_choice("**B**", label) == 0.0
    for good in ["B", "B.", "(B)", "Option B", "Answer: B", "The answer is B."]:
        assert revised_choice(good, label) == 1.0, good
    assert revised_choice("Based on the text, the answer is C", label) == 0.0
    assert revised_choice("Based on the text ...", label) == 0.0 and parse_option("Based on the text ...") is None
    assert revised_choice("They met in Paris.", label, ["London", "Paris", "Rome", "Oslo"]) == 1.0


def test_many_shot_raw_string_label_bug():
    assert official_any_upper("(C)", "(B)") == 1.0  # any character of the raw label counts
    assert score("many_shot", "(C)", "(B)") == 0.0


def test_other_scorers():
    assert score("kv", "the value is v-222", "v-222") == 1.0 and score("kv", "V-222", "v-222") == 0.0
    assert score("mf", "It is 42.", 42) == 1.0
    assert score("passkey", "the passkey is 12345", "12345") == 1.0
    assert score("summary", "the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    assert score("vt", "AAA BBB", "AAA BBB CCC") == pytest.approx(2 / 3)
    code = "def f(x):\n    return x + 1\n"
    assert score("repoqa", f"```python\n{code}```", code, candidates=[code, "def g():\n    pass\n"]) == 1.0
    with pytest.raises(ValueError, match="unknown SCBench"):
        score("nope", "", "")


def test_loading_and_truncation(scbench_dir):
    rows = load_rows("kv", scbench_dir)
    assert rows[0]["multi_turns"][1]["answer"] == "v-333"
    assert middle_truncate(list(range(10)), 4) == [0, 1, 8, 9]
    encode = lambda text: list(text.encode())  # noqa: E731
    item = to_item("kv", rows[0], 0, encode, lambda ids: bytes(ids).decode(), max_length=600)
    assert len(item.questions) == 2
    longest = max(len(encode(q.prompt)) for q in item.questions)  # the questions are asked after the context
    assert len(encode(item.context)) + longest + 2 * 150 == 600  # filled exactly: byte tokens add up
    with pytest.raises(ValueError, match="max length 420 leaves no room for the context of kv"):
        to_item("kv", rows[0], 0, encode, lambda ids: bytes(ids).decode(), max_length=420)
    assert item.questions[0].scorer("v-222") == 1.0 and item.questions[1].official("v-222") == 0.0


@pytest.mark.slow  # it imports datasets and asks its offline cache (23 s in a full run): the slow run holds it
def test_a_task_in_neither_a_file_nor_the_datasets_cache_is_not_found_locally(scbench_dir):
    with pytest.raises(FileNotFoundError, match="not found locally"):
        load_rows("summary", scbench_dir / "empty")


@pytest.mark.parametrize("line, problem", [
    ("{bad", "not JSON \\(Expecting property name enclosed in double quotes at column 2\\)"),
    ('{"id": 1, "context": "abc"}', 'not an SCBench row \\({"id": 1, "context": "abc"}\\)'),
    ('{"context": "abc", "multi_turns": [{"input": "q"}]}', 'multi_turns\\[0\\]={"input": "q"} \\(expected'),
    ("[1, 2]", "not an SCBench row \\(\\[1, 2\\]\\)"),
    ('{"context": 7, "multi_turns": [{"input": "q", "answer": "a"}]}', "context=7 \\(expected the shared context"),
    ('{"context": "abc", "multi_turns": []}', "multi_turns=\\[\\] \\(expected at least one turn\\)"),
    ('{"context": "abc", "multi_turns": [{"input": "", "answer": "a"}]}', 'multi_turns\\[0\\].input="" '),
    ('{"context": "abc", "multi_turns": [{"input": "q", "answer": null}]}', "multi_turns\\[0\\].answer=null "),
    ('{"context": "abc", "multi_turns": [{"input": "q", "answer": ""}]}', 'multi_turns\\[0\\].answer="" '),
    ('{"context": "abc", "multi_turns": [{"input": "q", "answer": [""]}]}', 'multi_turns\\[0\\].answer=\\[""\\] '),
    ('{"context": "abc", "multi_turns": [{"input": "q", "answer": []}]}', "multi_turns\\[0\\].answer=\\[\\] "),
])
def test_a_malformed_row_is_named_by_its_file_and_line(tmp_path, line, problem):
    good = json.dumps({"id": 0, "context": "abc", "multi_turns": [{"input": "q", "answer": "a"}]})
    (tmp_path / "scbench_kv.jsonl").write_text(f"{good}\n\n{line}\n")
    with pytest.raises(ValueError, match=f"{tmp_path / 'scbench_kv.jsonl'}, line 3: {problem}.*each line holds "
                                         '.*"multi_turns": \\[{"input"'):
        load_rows("kv", tmp_path)


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_a_file_of_no_rows_is_named(tmp_path, text):
    (tmp_path / "scbench_kv.jsonl").write_text(text)
    with pytest.raises(ValueError, match=f"^{tmp_path / 'scbench_kv.jsonl'} holds no rows"):
        load_rows("kv", tmp_path)


def test_a_file_that_is_not_utf8_is_named_by_its_line(tmp_path):
    good = json.dumps({"context": "abc", "multi_turns": [{"input": "q", "answer": "a"}]})
    (tmp_path / "scbench_kv.jsonl").write_bytes(good.encode() + b'\n{"context": "caf\xe9"}\n')
    with pytest.raises(UsageError, match=f"^{tmp_path / 'scbench_kv.jsonl'}, line 2: not UTF-8 \\(byte 0xe9 at "
                                         "column 17\\)"):
        load_rows("kv", tmp_path)


def test_a_byte_order_mark_and_crlf_are_read_as_utf8_text(tmp_path):
    row = {"context": "abc\u2028def", "multi_turns": [{"input": "q", "answer": "a"}]}
    (tmp_path / "scbench_kv.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(row, ensure_ascii=False).encode()
                                                + b"\r\n")
    assert load_rows("kv", tmp_path) == [row]


def test_a_directory_where_the_file_belongs_is_named(tmp_path):
    (tmp_path / "scbench_kv.jsonl").mkdir()
    with pytest.raises(UsageError, match="scbench_kv.jsonl is a directory; expected a JSONL file there"):
        load_rows("kv", tmp_path)


@pytest.mark.parametrize("make", [lambda path: os.mkfifo(path), lambda path: path.symlink_to("/dev/zero")])
def test_a_pipe_or_a_device_where_the_file_belongs_is_refused_before_it_is_read(tmp_path, make):
    """Probe 63: a FIFO blocked the run forever, /dev/zero filled the memory."""
    make(tmp_path / "scbench_kv.jsonl")
    with pytest.raises(UsageError, match="scbench_kv.jsonl is not a regular file; expected a JSONL file there"):
        load_rows("kv", tmp_path)


def test_a_lone_surrogate_is_named_by_its_line(tmp_path):
    """Valid JSON, but no text a tokenizer encodes (probe 63: a TypeError from the tokenizer)."""
    good = json.dumps({"context": "abc", "multi_turns": [{"input": "q", "answer": "a"}]})
    (tmp_path / "scbench_kv.jsonl").write_text(good + '\n{"context": "k1: \\ud800 v1", "multi_turns": [{"input": '
                                               '"k1?", "answer": "v1"}]}\n')
    with pytest.raises(UsageError, match=r'scbench_kv.jsonl, line 2: holds "\\ud800", half of a UTF-16 pair'):
        load_rows("kv", tmp_path)


def test_numbers_are_answers(tmp_path):
    """mf's answers are whole numbers (its scorer compares one integer); elsewhere a number, or a list of numbers and
    text, is a reference answer."""
    rows = [{"context": [3, 1, 2], "multi_turns": [{"input": "the largest?", "answer": 3},
                                                   {"input": "the smallest?", "answer": "1"}]}]
    (tmp_path / "scbench_mf.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert load_rows("mf", tmp_path) == rows
    rows = [{"context": "abc", "multi_turns": [{"input": "q", "answer": [1, "one"]}]}]
    (tmp_path / "scbench_kv.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert load_rows("kv", tmp_path) == rows


@pytest.mark.parametrize("task, row, problem", [
    ("choice_eng", {"options": 5}, "multi_turns\\[0\\].options=5 \\(expected the choices A-D: a list of text\\)"),
    ("choice_eng", {"options": ["a", 2]}, "options=\\[\"a\", 2\\] "),
    ("summary_with_needles", {"task": "foo"}, "multi_turns\\[0\\].task=\"foo\" \\(expected one of summary, passkey\\)"),
    ("kv", {"task": "foo"}, "task=\"foo\" \\(expected one of kv\\)"),
    ("kv", {"task": ["kv"]}, "task=\\[\"kv\"\\] \\(expected one of kv\\)"),
    ("mf", {"answer": float("nan")}, "answer=NaN \\(expected the reference answer: a whole number\\)"),
    ("mf", {"answer": 2.5}, "answer=2.5 "),
    ("mf", {"answer": [3]}, "answer=\\[3\\] "),
    ("kv", {"answer": float("inf")}, "answer=Infinity "),
    ("qa_eng", {"context": [1, 2]}, "context=\\[1, 2\\] \\(expected the shared context"),
    ("mf", {"context": [{"a": 1}, None]}, "context=\\[{\"a\": 1}, null\\] "),
])
def test_a_row_its_scorer_cannot_read_is_refused_before_any_work(tmp_path, task, row, problem):
    """What each task's turns are read and scored with is checked with the file (before the model loads): a turn
    of another sub-task, choice options that are not text, an answer mf's scorer cannot compare, a list as the
    context of a task other than mf."""
    context = row.pop("context", [3, 1, 2] if task == "mf" else "some shared context")
    turn = {"input": "which?", "answer": 3 if task == "mf" else "A", **row}
    (tmp_path / f"scbench_{task}.jsonl").write_text(json.dumps({"context": context, "multi_turns": [turn]}) + "\n")
    with pytest.raises(UsageError, match=f"scbench_{task}.jsonl, line 1: (multi_turns\\[0\\]\\.)?{problem}"):
        load_rows(task, tmp_path)


def test_compare_on_scbench_fixture(model_dir, scbench_dir, tmp_path):
    settings = CompareSettings(presses=["snapkv"], keep_fractions=[0.5], tasks=["scbench_kv", "scbench_choice_eng"],
                               n=2, length=700, model=str(model_dir), out=tmp_path, scbench_data=scbench_dir)
    with pytest.raises(ValueError, match=f"^--n 2: scbench_kv has 1 row\\(s\\) in {scbench_dir}; give --n 1 or "
                                         "fewer"):  # item 1 would never be written: a store verify never passes
        run_compare(settings, show_progress=False)
    assert not (tmp_path / "results.jsonl").exists()
    settings.n = 1
    store = run_compare(settings, show_progress=False)
    assert {r["task"] for r in store.rows} == {"scbench_kv", "scbench_choice_eng"}
    assert len(store.rows) == (2 + 1) * 2  # questions × (no prune + snapkv/flat@0.5)
    assert all("score_official" in r for r in store.rows)
    with pytest.raises(ValueError, match="--scbench-data"):
        run_compare(CompareSettings(presses=["snapkv"], tasks=["scbench"], model=str(model_dir), out=tmp_path))


def test_scbench_data_without_an_scbench_task_is_refused(scbench_dir):
    """It was ignored, where --haystack without a task that reads one is refused."""
    from workloads.tasks import registry

    with pytest.raises(ValueError, match=f"--scbench-data {scbench_dir}: none of the tasks reads SCBench; those "
                                         "that do: scbench_kv, .* \\(the group 'scbench'\\)"):
        registry.check(["niah_single_1", "vt"], "compact", "generated", scbench_dir)
    registry.check(["niah_single_1", "scbench_kv"], "compact", "generated", scbench_dir)
