"""RULER's metrics, exactly as ``scripts/eval/synthetic/constants.py`` and ``evaluate.py`` define them."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER: strip, then replace control characters with newlines."""
    return _CONTROL.sub("\n", prediction.strip())


def string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of references found as case-insensitive substrings of the prediction (per sample, in [0, 1])."""
    prediction = postprocess(prediction).lower()
    return sum(ref.lower() in prediction for ref in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """1 if any reference is a case-insensitive substring of the prediction."""
    prediction = postprocess(prediction).lower()
    return float(any(ref.lower() in prediction for ref in references))


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}
