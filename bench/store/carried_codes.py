"""A collection's carried groups: rows read under the code a carry named for them, their files left as they are.

``bench carry`` of a collection (``docs/results``) or of one setting group's folder of it does not rewrite the
group's files: it appends a record to the group folder's :data:`CARRIED` — the shared code the rows ran (``from``),
the code that gave every sampled value again (``to``), each method's own code before (``method_codes_from``) and after
(``method_codes``), and the stores of the folder it covered (``stores``) — and every reader of those stores reads
their rows under it (:func:`under_records`), as the rewrite would have left them. So carrying a group across an edit
of the runtime adds a few hundred bytes to history, not every row again (megabytes at each edit). A record without
``stores`` is one of a carry that rewrote its store's rows (a store outside a collection): it maps nothing. Each
record is checked as it is read (:func:`record_problem`), and against the rows it carries by every reader's checks
(:mod:`bench.store.carried_checks`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, read_bounded
from runtime.errors import UsageError, check_regular_file
from runtime.json_text import parse_json

from .label_read_back import read_back_problem
from .row_fields import BASELINE, BASELINE_CODE, CARRIED_FROM, CODE, METHOD_CODE, method_of

CARRIED = "carried.json"
"""A folder's record of its carried groups: a JSON list, one entry per carry, appended."""
REMEDY = "restore it from version control"
"""What a damaged record is refused with: a carry's record is committed with the rows it maps."""


def read_records(path: Path) -> list[dict]:
    """The records of the :data:`CARRIED` file ``path`` (none where there is none); one that is no such list, or a
    record of it that no carry writes (:func:`record_problem`), is a :class:`~runtime.errors.UsageError`
    naming it (rows read under it would name a code no rerun gave them), as is one that is no regular file (a pipe
    would be waited on for ever, a link to ``/dev/zero`` read until memory runs out)."""
    if not path.exists():
        return []
    check_regular_file(path, "the record of carried groups", REMEDY)
    data = read_bounded(path, METADATA_LIMIT, REMEDY)
    try:
        records = parse_json(data.decode())
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ValueError("expected a list of records")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{path}: not a record of carried groups ({error}); {REMEDY}") from None
    for index, record in enumerate(records):
        problem = record_problem(record)
        if problem is not None:
            raise UsageError(f"{path}: record {index}: {problem}, which no carry writes; {REMEDY}")
    return records


def record_problem(record: dict) -> str | None:
    """What makes ``record`` one that ``bench carry`` never writes, or None (probe 17, #5: a record of no contexts,
    no rows or a made-up code passed verify, and every reader read its rows at the code it named): its codes of the
    form of :data:`CODE`, ``to`` another than ``from``, the group's ``code`` its ``from``, each method's own code before
    and after (no prune's :data:`~bench.store.row_fields.BASELINE_CODE`; before, None for rows written before method
    codes), one ``[task, item, haystack]`` at least (the contexts it reran, ``sample`` or fewer), one row at least,
    and, where it names them, one store at least."""
    for field in ("from", "to"):
        if not (isinstance(record.get(field), str) and CODE.fullmatch(record[field])):
            return f"{field} {_shown(record.get(field))} (expected a code: 12 hex digits)"
    if record["from"] == record["to"]:
        return f"from and to are both {record['from']} (a carry names the code it carried the group to)"
    if not isinstance(record.get("group"), dict) or record["group"].get("code") != record["from"]:
        return f"group {_shown(record.get('group'))} (expected its settings, its code {record['from']}, the from code)"
    for field, before in (("method_codes_from", True), ("method_codes", False)):
        codes = record.get(field)
        if not isinstance(codes, dict) or not codes or not all(
                isinstance(m, str) and _method_code(m, code, before) for m, code in codes.items()):
            return (f"{field} {_shown(codes)} (expected {{method: its own code}}, 12 hex digits a code, "
                    f"{BASELINE_CODE!r} the code of {BASELINE!r})")
    if record["method_codes"].keys() != record["method_codes_from"].keys():
        return (f"method_codes names {sorted(record['method_codes'])}, method_codes_from "
                f"{sorted(record['method_codes_from'])} (expected the same methods, each with its code before and "
                "after)")
    wrong = next((method for method in record["method_codes"] if method != BASELINE and _label_problem(method)), None)
    if wrong is not None:  # the method named alone: a list of them is cut before it (probe 21, U2)
        return (f"method_codes names {_shown(wrong)}, which is no method's label as this bench writes it "
                f"(press/allocator): {_label_problem(wrong)}")
    contexts = record.get("contexts")
    if not isinstance(contexts, list) or not contexts or not all(_context(c) for c in contexts) or len(
            {json.dumps(c) for c in contexts}) < len(contexts):
        return (f"contexts {_shown(contexts)} (expected the contexts it reran, one [task, item, haystack] at least, "
                "each once)")
    for field, least in (("sample", len(contexts)), ("rows", 1), ("seed", 0)):
        if not (type(record.get(field)) is int and record[field] >= least):
            return f"{field} {_shown(record.get(field))} (expected an integer {least} or more)"
    stores = record.get("stores")  # none: a carry that rewrote its store's rows, whose own record it is
    if stores is not None and not (isinstance(stores, list) and stores and all(
            isinstance(s, str) and s not in (".", "..") and _FOLDER.fullmatch(s) for s in stores)
            and len(set(stores)) == len(stores)):
        return f"stores {_shown(stores)} (expected the names of the method folders it carried, one at least, each once)"
    return None


_FOLDER = re.compile(r"[A-Za-z0-9._-]+")
"""What a method folder's name is made of (:func:`bench.store.collection.method_folder`)."""


def _label_problem(method: str) -> str | None:
    """Why ``method`` is no method's label, ``press/allocator``, each read back as itself
    (:func:`~bench.store.label_read_back.read_back_problem`), or None."""
    press, slash, allocator = method.partition("/")
    if not slash:
        return "it has no '/' between its press and its allocator"
    return read_back_problem(press, "press") or read_back_problem(allocator, "allocator")


def _method_code(method: str, code, before: bool) -> bool:
    if before and code is None:  # rows written before method codes name none, no prune's too
        return True
    return code == BASELINE_CODE if method == BASELINE else isinstance(code, str) and CODE.fullmatch(code) is not None


def _context(context) -> bool:
    """Whether ``context`` is a ``[task, item, haystack]`` of a record: a task, an item 0 or more, a haystack or
    None (a row written before haystacks were named)."""
    return (isinstance(context, list) and len(context) == 3 and isinstance(context[0], str)
            and type(context[1]) is int and context[1] >= 0 and (context[2] is None or isinstance(context[2], str)))


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def carried_records(store: Path) -> list[dict]:
    """The records that name the store folder ``store``: those of its parent's :data:`CARRIED` (a collection's group
    folder) that list it among their ``stores``, in the order they were made."""
    return [r for r in read_records(Path(store).parent / CARRIED) if Path(store).name in r.get("stores", ())]


def read_under(rows: list[dict], store: Path) -> dict[int, Counter]:
    """``rows``, of the store folder ``store``, read under the records of its group folder's :data:`CARRIED` that
    name it (:func:`under_records`, in place), and what each of them carried: ``{its index in the file: how many
    rows of each [task, item, haystack]}``, rows it read at its ``to`` code and rows the store holds at that code
    (a carry that found a row there already kept it and dropped its own copy, rewriting the file with the rest at
    that code). A record that carried none of a store it names was edited, or one before it removed
    (:mod:`bench.store.carried_checks`)."""
    codes = [row.get("code") for row in rows]  # as the file holds them
    carried = {}
    for index, record in enumerate(read_records(Path(store).parent / CARRIED)):
        if Path(store).name in record.get("stores", ()):
            mapped = set(_carry(rows, record))
            carried[index] = Counter((row["task"], row["item"], row.get("haystack")) for i, row in enumerate(rows)
                                     if i in mapped or (codes[i] == record["to"] and _of_group(row, record)))
    return carried


def under_records(rows: list[dict], records: list[dict]) -> list[dict]:
    """``rows`` as the carries ``records`` name them, in order: a row of a record's group, of its ``from`` code and
    its method's code before, takes the ``to`` code and its method's code after, keeping the code it was computed by
    (``carried_from``); every other row is as it is."""
    for record in records:
        _carry(rows, record)
    return rows


def _carry(rows: list[dict], record: dict) -> list[int]:
    """The rows of ``rows`` that ``record`` carries, carried in place (:func:`under_records`): their indices."""
    before, after = record["method_codes_from"], record["method_codes"]
    carried = []
    for i, row in enumerate(rows):
        method = method_of(row)
        if _carried_away(row, record) and method in after and row.get(METHOD_CODE) == before.get(method):
            rows[i] = {**row, "code": record["to"], METHOD_CODE: after[method],
                       CARRIED_FROM: row.get(CARRIED_FROM, record["from"])}
            carried.append(i)
    return carried


def carried_from(row: dict, records: list[dict]) -> dict | None:
    """The first of ``records`` (a group folder's, :func:`read_records`) that carried ``row``'s group away from
    ``row``'s code, or None: a row read under them (:func:`under_records`) that still names such a code is one the
    carry did not cover (a method that was not in the group then, or another own code of it)."""
    return next((record for record in records if _carried_away(row, record)), None)


def _carried_away(row: dict, record: dict) -> bool:
    """Whether ``row`` is of the group and the code ``record`` carried from."""
    return row.get("code") == record["from"] and _of_group(row, record)


def _of_group(row: dict, record: dict) -> bool:
    """Whether ``row`` is of ``record``'s group but for its code."""
    return all(row.get(k) == v for k, v in record["group"].items() if k != "code")
