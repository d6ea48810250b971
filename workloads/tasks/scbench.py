"""SCBench (arXiv 2412.10319) in shared-context multi-query mode: every turn of a row is a question about one
shared context, answered from one compacted child.

Data come from a local copy only: a directory of ``scbench_<task>.jsonl`` files, or a ``datasets`` cache holding
``microsoft/SCBench`` (read with ``HF_DATASETS_OFFLINE=1``; nothing is downloaded).
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path

from runtime.bounded_read import read_bounded
from runtime.errors import UsageError

from .. import scbench_metrics
from .items import CONTEXT_TEMPLATE, Item, Question

SCBENCH_TASKS = ("kv", "prefix_suffix", "vt", "repoqa", "qa_eng", "qa_chn", "choice_eng", "many_shot", "summary",
                 "mf", "summary_with_needles", "repoqa_and_kv")
MAX_NEW_TOKENS = {"kv": 150, "prefix_suffix": 150, "vt": 30, "repoqa": 1024, "qa_eng": 40, "qa_chn": 40,
                  "choice_eng": 40, "many_shot": 10, "summary": 200, "mf": 5, "passkey": 15}
FILE_LIMIT = 2 << 30
"""Bytes of one task's JSONL file, read whole: SCBench's hold a hundred rows of up to a few hundred thousand tokens
(tens of MB), so 2 GiB, as much as a result store (:data:`bench.store.result_store.STORE_LIMIT`), is a wide margin
that a 20 GB file (sparse, or the wrong one) does not pass into memory (:mod:`runtime.bounded_read`)."""
SUBTASK_MAX_NEW = {"summary_with_needles": {"summary": 800, "passkey": 15}, "repoqa_and_kv": {"repoqa": 1024, "kv": 80}}
INSTRUCTIONS = {
    "kv": "Extract the value corresponding to the specified key in the JSON object below.",
    "choice_eng": "Read the book and answer the question. Choose the correct option (A, B, C or D).",
    "qa_eng": "Read the book and answer the question. Be very concise in your answer.",
    "qa_chn": "请阅读以下书籍并回答问题。",
    "repoqa": "Based on the function description and code context, please retrieve and repeat the exact described "
              "function from the code context in a code block wrapped by ```.",
    "mf": "Find the requested value in the list below.",
}


def load_rows(task: str, data: str | Path) -> list[dict]:
    """Rows of one SCBench task from a local directory of JSONL files or a local ``datasets`` cache."""
    if task not in SCBENCH_TASKS:
        raise UsageError(f"unknown SCBench task {task!r}; choose from {', '.join(SCBENCH_TASKS)}")
    path = Path(data) / f"scbench_{task}.jsonl"
    if path.exists() and not path.is_file():  # a directory, a pipe or a device (which would never end)
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise UsageError(f"{path} is {kind}; expected a JSONL file there, each line one SCBench row, {ROW}")
    if path.exists():
        rows = [_row(task, path, number, line) for number, line in enumerate(_lines(path), 1) if line.strip()]
        if not rows:
            raise UsageError(f"{path} holds no rows (each line holds one SCBench row, {ROW})")
        return rows
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # a cache lookup only: never a download
    try:
        import datasets

        return list(datasets.load_dataset("microsoft/SCBench", task, split="test", cache_dir=str(data)))
    except Exception as error:  # datasets raises several types for "not in the cache"
        raise FileNotFoundError(
            f"SCBench task {task!r} not found locally in {data} (expected {path.name} or a datasets cache): {error}"
        ) from None


def _lines(path: Path) -> list[str]:
    """The lines of an SCBench JSONL file (split at newlines only: JSON text may hold U+2028 as it is); a
    :class:`~runtime.errors.UsageError` naming the first line that is not UTF-8 (JSON's encoding)."""
    lines = []
    raw = read_bounded(path, FILE_LIMIT, f"give SCBench's own {path.name} (one row a line)")
    for number, line in enumerate(raw.split(b"\n"), 1):
        try:  # a byte-order mark before the first line is no part of it
            lines.append(line.decode("utf-8-sig" if number == 1 else "utf-8").removesuffix("\r"))
        except UnicodeDecodeError as error:
            raise UsageError(f"{path}, line {number}: not UTF-8 (byte {line[error.start]:#04x} at column "
                             f"{error.start + 1}); JSONL is UTF-8: convert the file, e.g. with iconv") from None
    return lines


ROW = ('{"context": "<the shared context>", "multi_turns": [{"input": "<a question>", "answer": "<its answer>"}, '
       '...]}')
"""What one line of an SCBench JSONL file holds (:func:`to_item` reads these keys; the dataset's others pass)."""


def _row(task: str, path: Path, number: int, line: str) -> dict:
    """The SCBench row of ``task`` on line ``number`` of ``path``; a :class:`~runtime.errors.UsageError` naming the
    file, the line and what a row holds if it is not one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise UsageError(f"{path}, line {number}: not JSON ({error.msg} at column {error.colno}); each line holds "
                         f"one SCBench row, {ROW}") from None
    turns = row.get("multi_turns") if isinstance(row, dict) else None
    if not (isinstance(row, dict) and "context" in row and isinstance(turns, list)):
        raise UsageError(f"{path}, line {number}: not an SCBench row ({_shown(row)}); each line holds one, {ROW}")
    surrogate = _lone_surrogate(row)
    if surrogate:
        raise UsageError(f"{path}, line {number}: holds {surrogate}, half of a UTF-16 pair, which is no text; "
                         f"each line holds one SCBench row, {ROW}")
    problem = _row_problem(task, row["context"], turns)
    if problem:
        raise UsageError(f"{path}, line {number}: {problem}; each line holds one SCBench row, {ROW}")
    return row


def _row_problem(task: str, context, turns: list) -> str | None:
    """What makes a row with these fields no row of ``task``, or None: its context text (for mf, a list of numbers),
    and at least one turn, each a question and a non-empty answer (text or a finite number, or a list of them) that
    the turn's scorer reads — one whole number for mf, a sub-task of the task's own where a turn names one, the
    options of choice_eng as a list of text. Checked before any model loads: a row that passes is read and scored."""
    numbers = isinstance(context, list) and context and all(_a_number(x) for x in context)
    if not (isinstance(context, str) and context.strip()) and not (task == "mf" and numbers):
        return f"context={_shown(context)} (expected the shared context: text, or for mf a list of numbers)"
    if not turns:
        return "multi_turns=[] (expected at least one turn)"
    subtasks = SUBTASK_MAX_NEW.get(task, {task: None})
    for k, turn in enumerate(turns):
        if not (isinstance(turn, dict) and {"input", "answer"} <= set(turn)):
            return f"multi_turns[{k}]={_shown(turn)} (expected {{\"input\": ..., \"answer\": ...}})"
        if not (isinstance(turn["input"], str) and turn["input"].strip()):
            return f"multi_turns[{k}].input={_shown(turn['input'])} (expected the question: text)"
        sub = turn.get("task") or task
        if not isinstance(sub, str) or sub not in subtasks:
            return f"multi_turns[{k}].task={_shown(turn['task'])} (expected one of {', '.join(subtasks)})"
        answer = turn["answer"]
        answers = answer if isinstance(answer, list) else [answer]
        if sub == "mf" and not _a_whole_number(answer):  # its scorer compares one integer
            return f"multi_turns[{k}].answer={_shown(answer)} (expected the reference answer: a whole number)"
        if not answers or not all(_an_answer(a) for a in answers):
            return (f"multi_turns[{k}].answer={_shown(answer)} (expected the reference answer: non-empty text or a "
                    "number, or a non-empty list of them)")
        options = turn.get("options")
        if task == "choice_eng" and options and not (isinstance(options, list)
                                                       and all(isinstance(o, str) for o in options)):
            return f"multi_turns[{k}].options={_shown(options)} (expected the choices A-D: a list of text)"
    return None


def _lone_surrogate(row) -> str | None:
    """The first lone surrogate escape (``\\ud800``) of a row's text, as JSON writes it; None where there is none.
    JSON may hold one, and no tokenizer encodes it."""
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        return json.dumps(error.object[error.start])
    return None


def _a_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _a_whole_number(value) -> bool:
    if isinstance(value, str):
        return value.strip().lstrip("+-").isdigit() and value.strip().isascii()
    return _a_number(value) and float(value).is_integer()


def _an_answer(value) -> bool:
    return (isinstance(value, str) and bool(value.strip())) or _a_number(value)


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def middle_truncate(ids: list[int], limit: int) -> list[int]:
    """Keep the first and last halves of ``limit`` tokens, as the official evaluation does."""
    if len(ids) <= limit:
        return ids
    half = limit // 2
    return ids[:half] + ids[len(ids) - (limit - half) :]


def _max_new(task: str, turn: dict) -> int:
    sub = turn.get("task")
    return SUBTASK_MAX_NEW[task][sub] if task in SUBTASK_MAX_NEW and sub else MAX_NEW_TOKENS[task]


def to_item(task: str, row: dict, index: int, encode, decode, max_length: int, max_turns: int = 5) -> Item:
    """One SCBench row as an :class:`Item`: one question per turn, scored by the revised scorer (``official`` in
    ``meta``), and the context middle-truncated so that the framed context, the longest question and the generation
    budget of every turn take at most ``max_length`` tokens."""
    turns = row["multi_turns"][:max_turns]
    context = row["context"]
    if isinstance(context, list):  # mf stores a list of integers
        context = " ".join(str(x) for x in context)
    questions = []
    for turn in turns:
        sub = turn.get("task") or task
        options = turn.get("options")
        text = turn["input"]
        if task == "choice_eng" and options:
            text += "\n" + "\n".join(f"{letter}. {option}" for letter, option in zip("ABCD", options))
        label = turn["answer"]
        question = Question(text, "", scbench_metrics.as_list(label), _max_new(task, turn))
        question.scorer = partial(scbench_metrics.score, sub, label=label, options=options, revised=True)
        question.official = partial(scbench_metrics.score, sub, label=label, options=options, revised=False)
        questions.append(question)
    header = INSTRUCTIONS.get(task, "")
    asked = sum(q.max_new_tokens for q in questions) + max(len(encode(q.prompt)) for q in questions)
    budget = max_length - asked - len(encode(CONTEXT_TEMPLATE.format(header=header, body="")))
    ids = encode(context)
    while True:  # text joined at a boundary may encode to a token more than its parts: cut again until it fits
        if budget <= 0:
            raise UsageError(f"max length {max_length} leaves no room for the context of {task} (its longest "
                             f"question and the generation budget of its {len(questions)} turns take {asked} tokens)")
        context = decode(middle_truncate(ids, budget))
        over = len(encode(CONTEXT_TEMPLATE.format(header=header, body=context))) + asked - max_length
        if over <= 0:
            break
        budget -= over
    return Item(f"scbench_{task}", header, context, questions, "scbench", index=index,
                meta={"id": row.get("id")})
