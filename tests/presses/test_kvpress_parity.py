"""Parity with kvpress on a dense model, the check of ``benchmarks/kvpress_side_by_side.py`` kept from rotting:
for the same press and a whole-size budget, this project's plan keeps exactly the positions kvpress's compressed
cache holds and the first answer token's logits agree within 1e-4; where scores tie exactly at the boundary the
two tools break the tie differently (and only there); where p·n is not whole kvpress keeps one entry fewer."""

import pytest
import torch

from testing.kvpress_parity import LOGIT_TOLERANCE, parity
from tests.helpers import REAL_MODEL

# SnapKV's window shrunk to 8: kvpress gives its whole window one score (max + 1), so a budget below the window
# would be decided by tie-breaking (the test below), not by the press
PRESSES = {"snapkv": {"window_size": 8}, "knorm": {}, "keydiff": {}}


def _questions(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (5,), generator=generator) for _ in range(2)]


@pytest.mark.parametrize("keep_fraction", [0.25, 0.5, 0.75])
@pytest.mark.parametrize("name", sorted(PRESSES))
def test_kept_positions_and_first_logits_equal_kvpress(tiny, name, keep_fraction):
    model = tiny("qwen3")
    # 96 distinct tokens: no two keys of a layer-0 head are one token's key rotated (see the tie test below)
    ids = torch.randperm(97, generator=torch.Generator().manual_seed(0))[:96]
    result = parity(model, ids, _questions(), name, keep_fraction, **PRESSES[name])
    assert result.kept_ours == result.kept_kvpress == keep_fraction * 96
    assert result.heads == 3 * 2 and result.heads_differing == 0
    assert result.max_logit_diff <= LOGIT_TOLERANCE
    assert result.holds


def test_knorm_ties_are_broken_differently_and_only_ties_differ(tiny):
    """Eight distinct tokens repeated: at layer 0 every occurrence of a token has the same key up to RoPE's
    rotation, so Knorm's scores tie bit for bit. kvpress keeps whichever tied entries ``torch.topk`` returns,
    this project the earliest; the kept sets differ at those ties alone, and forked on kvpress's positions this
    runtime reproduces kvpress's logits."""
    model = tiny("qwen3")
    ids = torch.randint(0, 8, (96,), generator=torch.Generator().manual_seed(0))
    result = parity(model, ids, _questions(), "knorm", 0.5)
    assert result.kept_ours == result.kept_kvpress == 48
    assert result.heads_differing > 0 and result.differences_are_ties and result.differing_layers == [0]
    assert result.max_logit_diff_on_kvpress_positions <= LOGIT_TOLERANCE
    assert not result.holds


def test_budget_that_is_not_whole_keeps_one_fewer_in_kvpress(tiny):
    """n = 90, p = 0.25: p·n = 22.5; the flat allocator rounds half up (23), kvpress floors n·(1 − r) (22)."""
    model = tiny("qwen3")
    ids = torch.randperm(97, generator=torch.Generator().manual_seed(0))[:90]
    result = parity(model, ids, _questions(), "keydiff", 0.25)
    assert (result.kept_ours, result.kept_kvpress) == (23, 22)
    assert result.heads_differing == result.heads and not result.differences_are_ties
    assert result.max_logit_diff_on_kvpress_positions <= LOGIT_TOLERANCE  # the cache itself still agrees


def test_snapkv_budget_below_its_window_is_decided_by_tie_breaking(tiny):
    """kvpress's SnapKV scores its whole 64-token window ``max + 1``; a budget of 24 is then filled from the window
    alone, and which 24 of its entries is tie-breaking: torch's ``topk`` order there, the earliest here."""
    model = tiny("qwen3")
    ids = torch.randperm(97, generator=torch.Generator().manual_seed(0))[:96]
    result = parity(model, ids, _questions(), "snapkv", 0.25)  # kvpress's default window, 64
    assert result.kept_ours == result.kept_kvpress == 24
    assert result.heads_differing == result.heads and result.differences_are_ties
    assert result.max_logit_diff_on_kvpress_positions <= LOGIT_TOLERANCE


REAL_PRESSES = ["snapkv", "knorm", "keydiff", "ExpectedAttentionPress", "TOVAPress"]


@pytest.fixture(scope="module")
def real_text_ids(tiny):
    """320 tokens of held-out real text (a standard-library module) and one question, in the real model's ids."""
    from pretrained.loading import load
    from workloads.corpus import documents

    _, tokenizer, _ = load(REAL_MODEL)
    text = documents("python-stdlib", "heldout")[0][1]
    question = torch.tensor(tokenizer("\nWhat does this module do?")["input_ids"])
    return torch.tensor(tokenizer(text)["input_ids"][:320]), [question]


@pytest.mark.realmodel
# each press at 0.25 in the default run; at 0.5 (~5 s each) CI's slow run holds them
@pytest.mark.parametrize("keep_fraction", [0.25, pytest.param(0.5, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", REAL_PRESSES)
def test_real_model_keeps_what_kvpress_keeps(tiny, real_text_ids, name, keep_fraction):
    """On SmolLM2-135M-Instruct (30 layers × 3 KV heads) and real text, kvpress's presses through the bridge keep
    kvpress's positions in every head, or differ only at exact ties of the budget's edge (Knorm at layer 0, where a
    token's keys repeat up to rotation); forked on kvpress's positions the first answer token's logits agree."""
    model = tiny(REAL_MODEL)
    ids, questions = real_text_ids
    result = parity(model, ids, questions, name, keep_fraction)
    assert result.kept_ours == result.kept_kvpress == keep_fraction * 320
    assert result.heads == 30 * 3
    assert result.heads_differing == 0 or result.differences_are_ties, result
    assert result.max_logit_diff_on_kvpress_positions <= LOGIT_TOLERANCE
    if result.heads_differing == 0:
        assert result.max_logit_diff <= LOGIT_TOLERANCE


@pytest.mark.realmodel
# 0.3 in the default run; 0.5 (~9 s) CI's slow run holds
@pytest.mark.parametrize("keep_fraction", [0.3, pytest.param(0.5, marks=pytest.mark.slow)])
def test_real_model_kvzip_global_keeps_what_kvpress_kvzip_keeps(tiny, keep_fraction):
    """KVzip with the global allocator against kvpress's own ``KVzipPress`` (its reconstruction passes, its sinks =
    this project's protected chat prefix, one budget over all layers): the same positions in all 90 heads, or
    differences only at exact ties of the budget's edge; the first answer token's logits agree."""
    from pretrained.loading import load
    from runtime import encode_text
    from testing.kvzip_parity import chat_prefix, kvzip_parity
    from workloads.corpus import documents

    model = tiny(REAL_MODEL)
    _, tokenizer, _ = load(REAL_MODEL)
    sink = len(chat_prefix(tokenizer))
    text = encode_text(tokenizer, documents("python-stdlib", "heldout")[0][1])
    body = torch.tensor(text[: 300 - (300 + sink) % 10])  # p·n whole for p in tenths
    question = torch.tensor(encode_text(tokenizer, "\nWhat does this module do?<|im_end|>\n<|im_start|>assistant\n"))
    result = kvzip_parity(model, tokenizer, body, question, keep_fraction)
    assert result.kept_ours == result.kept_kvpress == round(keep_fraction * result.n_context) * 90
    assert result.heads == 90
    assert result.heads_differing == 0 or result.differences_are_ties, result
    assert result.kvpress_keeps_our_top_ranked
    assert result.max_logit_diff <= LOGIT_TOLERANCE
