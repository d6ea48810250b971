"""JSON text from a file the user can edit (a record, an artifact's settings, a store's row), parsed so that text
Python cannot hold is bad JSON like any other: ``json.loads`` raises ``RecursionError`` for arrays nested a few
thousand deep and a bare ``ValueError`` for an integer past ``sys.get_int_max_str_digits()`` digits, neither of which
the readers' ``except json.JSONDecodeError`` takes, so either would end a run in a traceback."""

import json
import sys


class JSONLimitError(json.JSONDecodeError):
    """JSON text past what Python parses (nested too deep, an integer too long): a ``json.JSONDecodeError``, so that
    every reader's clause for bad JSON turns it into its usual one line. Its message says which limit, without the
    line and column a syntax error gives (a limit is reached by the whole text, not at one character)."""

    def __init__(self, reason: str):
        super().__init__(reason, "", 0)
        self.args = (reason,)  # str() is the reason alone, not "reason: line 1 column 1 (char 0)"


def parse_json(text: str | bytes):
    """``text`` parsed as ``json.loads`` does; ``json.JSONDecodeError`` where it is no JSON Python can hold (a
    :class:`JSONLimitError` for the limits), ``UnicodeDecodeError`` for bytes that are not UTF-8."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JSONLimitError("nested deeper than Python parses") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise
    except ValueError:  # from int() on a literal past the digit limit, the one other ValueError json.loads raises
        raise JSONLimitError(f"an integer of more than {sys.get_int_max_str_digits()} digits") from None
