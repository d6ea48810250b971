"""A collection's carried groups: rows read under the code a carry named for them, their files left as they are.

``bench carry`` of a collection (``docs/results``) or of one setting group's folder of it does not rewrite the
group's files: it appends a record to the group folder's :data:`CARRIED` — the shared code the rows ran (``from``),
the code that gave every sampled value again (``to``), each method's own code before (``method_codes_from``) and after
(``method_codes``), and the stores of the folder it covered (``stores``) — and every reader of those stores reads
their rows under it (:func:`under_records`), as the rewrite would have left them. So carrying a group across an edit
of the runtime adds a few hundred bytes to history, not every row again (megabytes at each edit). A record without
``stores`` is one of a carry that rewrote its store's rows (a store outside a collection): it maps nothing.
"""

from __future__ import annotations

from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, read_bounded
from runtime.errors import UsageError, check_regular_file
from runtime.json_text import parse_json

from .row_fields import CARRIED_FROM, METHOD_CODE, method_of

CARRIED = "carried.json"
"""A folder's record of its carried groups: a JSON list, one entry per carry, appended."""
_RECORD_FIELDS = {"group": dict, "from": str, "to": str, "method_codes": dict}


def read_records(path: Path) -> list[dict]:
    """The records of the :data:`CARRIED` file ``path`` (none where there is none); one that is no such list is a
    :class:`~runtime.errors.UsageError` naming it (rows read without it would be of their old code), as is one that
    is no regular file (a pipe would be waited on for ever, a link to ``/dev/zero`` read until memory runs out)."""
    if not path.exists():
        return []
    check_regular_file(path, "the record of carried groups", "restore it from version control")
    data = read_bounded(path, METADATA_LIMIT, "restore it from version control")
    try:
        records = parse_json(data.decode())
        if not isinstance(records, list) or not all(
                isinstance(r, dict) and all(isinstance(r.get(k), kind) for k, kind in _RECORD_FIELDS.items())
                for r in records):
            raise ValueError("expected a list of records, each with a group, from, to and method_codes")
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{path}: not a record of carried groups ({error}); restore it from version control") \
            from None
    return records


def carried_records(store: Path) -> list[dict]:
    """The records that name the store folder ``store``: those of its parent's :data:`CARRIED` (a collection's group
    folder) that list it among their ``stores``, in the order they were made."""
    return [r for r in read_records(Path(store).parent / CARRIED)
            if isinstance(r.get("stores"), list) and Path(store).name in r["stores"]]


def under_records(rows: list[dict], records: list[dict]) -> list[dict]:
    """``rows`` as the carries ``records`` name them, in order: a row of a record's group, of its ``from`` code and
    its method's code before, takes the ``to`` code and its method's code after, keeping the code it was computed by
    (``carried_from``); every other row is as it is."""
    for record in records:
        before, after = record.get("method_codes_from", {}), record["method_codes"]
        for i, row in enumerate(rows):
            method = method_of(row)
            if _carried_away(row, record) and method in after and row.get(METHOD_CODE) == before.get(method):
                rows[i] = {**row, "code": record["to"], METHOD_CODE: after[method],
                           CARRIED_FROM: row.get(CARRIED_FROM, record["from"])}
    return rows


def carried_from(row: dict, records: list[dict]) -> dict | None:
    """The first of ``records`` (a group folder's, :func:`read_records`) that carried ``row``'s group away from
    ``row``'s code, or None: a row read under them (:func:`under_records`) that still names such a code is one the
    carry did not cover (a method that was not in the group then, or another own code of it)."""
    return next((record for record in records if _carried_away(row, record)), None)


def _carried_away(row: dict, record: dict) -> bool:
    """Whether ``row`` is of the group and the code ``record`` carried from."""
    return row.get("code") == record["from"] and all(row.get(k) == v for k, v in record["group"].items()
                                                     if k != "code")
