"""Utility labels: the closed form of Eq. 2 equals brute-force deletion; reconstruction and coverage checks."""

import torch

from gatesight_learning.labels import (
    Sampler,
    _continuation_attention,
    _out_proj_blocks,
    brute_force_utility,
    closed_form_utility,
    max_normalise,
    utility_labels,
)
from runtime import prefill
from tests.helpers import token_ids


def test_closed_form_equals_brute_force_deletion(tiny):
    parent = prefill(tiny("qwen3_5"), token_ids(80, 0))
    sampler = Sampler(seed=3)
    continuations = [torch.tensor(parent.answer(token_ids(1, s), 12, choose=sampler).tokens) for s in range(2)]
    labels, checks = utility_labels(parent, continuations, n=80, check_entries=80)
    assert checks.max_closed_form_error < 1e-9, checks  # float64 attention: rounding only
    assert checks.max_reconstruction_error < 1e-5
    assert checks.covered
    assert set(labels) == set(parent.adapter.attention_layers)
    assert all(v.shape == (2, 80) and (v > 0).all() for v in labels.values())
    normalised = max_normalise(labels)
    assert all(torch.allclose(v.amax(-1), torch.ones(2)) for v in normalised.values())


def test_a_long_future_labelled_block_by_block_gets_the_labels_of_one_block(tiny):
    """A future as long as the window (the reconstruction) would need ``[H, T, n + T]`` float64 at once: 57 GB at
    30,000 tokens. Block by block, the labels and their checks are those of the whole future at once."""
    import gatesight_learning.labels as labels_module

    parent = prefill(tiny("qwen3_5"), token_ids(60, 4))
    future = [token_ids(40, 5)]
    whole, whole_checks = utility_labels(parent, future, n=60, check_entries=20, seed=1)
    g = parent.adapter.geometry
    assert len(labels_module.token_blocks(40, g.num_heads, g.group_size, 100)) == 1  # one block: today's path
    budget = 8 * 100 * max(g.num_heads, g.group_size ** 2) * 7  # seven tokens a block
    assert [b.stop - b.start for b in labels_module.token_blocks(40, g.num_heads, g.group_size, 100, budget)] == \
        [7] * 5 + [5]
    blocked, blocked_checks = utility_labels(parent, future, n=60, check_entries=20, seed=1, block_bytes=budget)
    for layer in whole:
        torch.testing.assert_close(blocked[layer], whole[layer], rtol=1e-6, atol=0)
    assert blocked_checks.max_closed_form_error < 1e-9 and blocked_checks.max_reconstruction_error < 1e-5
    assert abs(blocked_checks.max_reconstruction_error - whole_checks.max_reconstruction_error) < 1e-6


def test_brute_force_is_an_actual_deletion(tiny):
    """Independent check of the reference itself: a deleted entry's output equals attention without its key."""
    parent = prefill(tiny("qwen3_5"), token_ids(30, 1))
    layer = parent.adapter.attention_layers[0]
    captured = {}

    class Capture:
        wants_recurrent_signals = False

        def on_attention(self, layer_idx, hidden, query, gate, keys, values, output):
            captured[layer_idx] = {"query": query, "gate": gate, "keys": keys, "values": values, "output": output}

    parent.logits(token_ids(5, 2), observer=Capture())
    probs, outputs, values = _continuation_attention(parent, layer, captured[layer], slice(0, 5))
    blocks = _out_proj_blocks(parent, layer)
    entry = torch.tensor([7])
    brute = brute_force_utility(probs, outputs, values, blocks, 2, entry)
    closed = closed_form_utility(probs, outputs, values, blocks, 2, 30)
    assert torch.allclose(brute[:, 0], closed[:, 7], atol=1e-5)
    # recompute by physically dropping key 7 for KV head 0's query heads (0, 1)
    keys = torch.cat([parent.kv[layer].keys, captured[layer]["keys"]], 1)
    vals = torch.cat([parent.kv[layer].values, captured[layer]["values"]], 1)
    keep = torch.tensor([i for i in range(keys.shape[1]) if i != 7])
    q = captured[layer]["query"][:2]
    logits = q @ keys[0, keep].T * parent.adapter.attention_module(layer).scaling
    logits[..., -5:] = logits[..., -5:].masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    dropped = logits.softmax(-1) @ vals[0, keep]
    delta = torch.einsum("hDd,htd->tD", blocks[:2], dropped - outputs[:2])
    assert torch.allclose(delta.norm(dim=-1).max().double(), brute[0, 0], atol=1e-5)


def test_sampler_is_seeded_and_respects_top_k():
    logits = torch.linspace(0, 5, 50)
    draws = [Sampler(seed=1)(logits) for _ in range(3)]
    assert draws == [Sampler(seed=1)(logits)] * 3
    sampler = Sampler(seed=2, top_k=3)
    assert {sampler(logits) for _ in range(50)} <= {47, 48, 49}


def test_reconstruction_future_is_the_window_asked_back(model_dir):
    """label_windows's second label kind is Eq. 2 over one teacher-forced future: the request for the text, then
    the window itself; both kinds pass the closed-form = deletion check. Documents labelled together (their sampled
    futures decoded as one batch) get what each gets alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gatesight_learning.record import CHAT_PREFIX, RECONSTRUCTION_REQUEST, label_windows
    from runtime import CHATML_ASSISTANT_TURN, EvidenceRequest, encode_text

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs."
    other = "Sphinx of black quartz, judge my vow; a longer second document labelled in the same batch."
    together = label_windows(model, tokenizer, [text, other], continuations=2, max_new_tokens=5, seed=1,
                             check_entries=16)
    for (signals, labels, _, _), alone_text in zip(together, (text, other)):
        [(signals_alone, labels_alone, _, _)] = label_windows(model, tokenizer, [alone_text], continuations=2,
                                                           max_new_tokens=5, seed=1, check_entries=16)
        for layer, s in signals_alone.items():
            assert torch.allclose(signals[layer], s, atol=1e-6)
        for kind in labels_alone:
            for layer, u in labels_alone[kind].items():
                assert torch.allclose(labels[kind][layer], u, atol=1e-5), (kind, layer)
    signals, labels, scales, checks = together[0]
    assert set(labels) == {"labels", "reconstruction"} and checks.covered
    assert checks.max_closed_form_error < 1e-9, checks  # float64 attention: rounding only
    encode = lambda s: encode_text(tokenizer, s)  # noqa: E731
    prefix, body = encode(CHAT_PREFIX), encode(text)
    parent = prefill(model, torch.tensor(prefix + body + encode(CHATML_ASSISTANT_TURN)), protected=len(prefix),
                     evidence=EvidenceRequest(recurrent_signals=True))
    raw, _ = utility_labels(parent, [torch.tensor(encode(RECONSTRUCTION_REQUEST) + body)], len(prefix) + len(body))
    expected = max_normalise({layer: u[:, len(prefix):] for layer, u in raw.items()})
    for layer, u in expected.items():
        assert torch.allclose(labels["reconstruction"][layer], u, atol=1e-6)
        # label × scale is the raw utility: one scale across layers and heads (a change of the residual stream)
        assert torch.allclose(labels["reconstruction"][layer] * scales["reconstruction"][layer][:, None],
                              raw[layer][:, len(prefix):], rtol=1e-5, atol=1e-9)
        assert not torch.allclose(labels["labels"][layer], u, atol=1e-3)  # a different future, different labels


def test_a_longer_future_checks_proportionally_fewer_entries_and_at_least_one(tiny, monkeypatch):
    """Deletion costs a pass over the whole future per entry: a future k times longer than CHECKED_TOKENS checks k
    times fewer entries a layer (at least one), a shorter one exactly ``check_entries``; the labels are the same."""
    import gatesight_learning.labels as labels_module

    parent = prefill(tiny("qwen3_5"), token_ids(60, 4))
    checked = []
    real = labels_module.brute_force_utility
    monkeypatch.setattr(labels_module, "brute_force_utility",
                        lambda *args: checked.append(args[-1].numel()) or real(*args))
    monkeypatch.setattr(labels_module, "CHECKED_TOKENS", 10)
    expected = {5: 8, 10: 8, 20: 4, 40: 2, 200: 1}
    for size, count in expected.items():
        checked.clear()
        labels, checks = utility_labels(parent, [token_ids(size, 5)], n=60, check_entries=8, seed=1)
        assert set(checked) == {count}, (size, checked)
        assert checks.max_closed_form_error < 1e-9
        unchecked, _ = utility_labels(parent, [token_ids(size, 5)], n=60, check_entries=0)
        assert all(torch.equal(labels[layer], unchecked[layer]) for layer in labels)
