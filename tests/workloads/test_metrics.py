"""RULER metrics on hand-written cases."""

from workloads.metrics import postprocess, string_match_all, string_match_part


def test_string_match_all():
    assert string_match_all(" The numbers are 123 and 456.", ["123", "456"]) == 1.0
    assert string_match_all("only 123", ["123", "456", "789", "000"]) == 0.25
    assert string_match_all("ABC-def", ["abc-DEF"]) == 1.0  # case-insensitive
    assert string_match_all("", ["x"]) == 0.0


def test_string_match_part():
    assert string_match_part("Paris, I think", ["London", "Paris"]) == 1.0
    assert string_match_part("Rome", ["London", "Paris"]) == 0.0


def test_postprocess_replaces_control_characters():
    assert postprocess("  a\tb\x01c \n") == "a\nb\nc"
