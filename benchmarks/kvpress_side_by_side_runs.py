"""The two sides of the kvpress side by side (``benchmarks/kvpress_side_by_side.py``) and what each measures: the
random dense Qwen3 and the workload both run, kvpress's pipeline and this project's protocol each timed by the wall and
CPU clocks (:func:`measure_side`, one side per process, its peak resident set its own), and each side's parts measured
apart (:func:`components`).
"""

from __future__ import annotations

import random
import re
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, pipeline

import presses
from hybridmodel.tokenizer import build_tokenizer
from presses.preparation import evidence_for
from runtime import CHATML_ASSISTANT_TURN, adapter_for, encode_text, prefill
from testing.kvpress_parity import kvpress_prefill, uncompressed_keys
from testing.tiny_models import perturbed

CHAT_HEADER = "<|im_start|>user\n"
"""What kvpress's pipeline puts before the context with the byte tokenizer's ChatML template (6 tokens)."""
COMPONENT_PRESS = ("knorm", 0.25)
"""The press and kept fraction whose cache the per-part timings answer from."""


# ---- model and workload ---------------------------------------------------------------------------------------
def build_model(layers: int = 8, hidden: int = 256, heads: int = 8, kv_heads: int = 4, head_dim: int = 32,
                seed: int = 0) -> Qwen3ForCausalLM:
    """A random dense Qwen3 over the byte tokenizer's 260 ids, float32, weights perturbed as the tests' models are.

    The output head is zeroed for ids ≥ 128, so that every greedy token decodes to exactly one character (a lone
    byte ≥ 128 decodes to the same replacement character whatever it is): equal answer strings are then equal
    tokens. The generation config has no end-of-sequence token, so every answer is exactly ``max_new_tokens``
    long on both sides.
    """
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=260, hidden_size=hidden, intermediate_size=hidden * 3 // 2,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=32768, tie_word_embeddings=False)
    model = perturbed(Qwen3ForCausalLM(config))
    with torch.no_grad():
        model.lm_head.weight[128:] = 0
    model.generation_config.eos_token_id = None
    return model


def workload(tokenizer, n: int, questions: int, question_chars: int, seed: int = 0):
    """The framed context's ids (``[n]``), its text, and ``questions`` questions of ``question_chars`` bytes.

    Printable ASCII bytes from one seeded generator, one token each; the framing's header (6 tokens, 17
    characters) counts towards ``n``.

    Returns
    -------
    tuple[torch.Tensor, str, list[str], list[torch.Tensor]]
        Context ids, context text, question texts, and each question's ids with the assistant turn appended.
    """
    rng = random.Random(seed)
    text = lambda length: "".join(chr(rng.randrange(32, 127)) for _ in range(length))  # noqa: E731
    context = text(n - len(encode_text(tokenizer, CHAT_HEADER)))
    texts = ["\n" + text(question_chars - 1) for _ in range(questions)]
    ids = torch.tensor(encode_text(tokenizer, CHAT_HEADER + context))
    if ids.numel() != n:
        raise ValueError(f"the framed context is {ids.numel()} tokens, not {n}")
    return ids, context, texts, [torch.tensor(encode_text(tokenizer, q + CHATML_ASSISTANT_TURN)) for q in texts]


def kvpress_press(name: str, keep_fraction: float):
    """The kvpress object that ``kvpress:<name>`` names here, at ``compression_ratio = 1 − keep_fraction``."""
    scorer = presses.get(f"kvpress:{name}").press
    return type(scorer)(**{**vars(scorer), "compression_ratio": 1 - keep_fraction})


# ---- the two sides ----------------------------------------------------------------------------------------------
def run_kvpress(model, tokenizer, work, names, fractions, max_new_tokens: int):
    """kvpress's pipeline once per (press, ratio) on the texts of ``work`` (:func:`workload`): seconds and
    answers per cell."""
    _, context, questions, _ = work
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    cells = []
    for name in names:
        for p in fractions:
            t0 = _clock()
            answers = pipe(context, questions=questions, press=kvpress_press(name, p),
                           max_new_tokens=max_new_tokens)["answers"]
            cells.append({"press": name, "p": p, **_since(t0), "answers": answers})
            progress(f"kvpress  {name:8s} p={p:<6} {shown(cells[-1])}")
    return {"cells": cells}


def run_ours(model, tokenizer, work, names, fractions, max_new_tokens: int):
    """One prefill, one Selection per press, one fork per kept fraction answering every question (the ids of
    ``work``, :func:`workload`, which are the ids kvpress's pipeline makes of its texts)."""
    ids, _, _, question_ids = work
    t0 = _clock()
    scorers = {name: presses.get(f"kvpress:{name}") for name in names}
    evidence = evidence_for(scorers.values(), adapter_for(model))  # what every press reads, in one prefill
    # protected=0: every context token is a candidate, as in kvpress's pipeline
    parent = prefill(model, ids, protected=0, evidence=evidence, tokenizer=tokenizer)
    prefill_time = _since(t0)
    progress(f"ours     prefill          {shown(prefill_time)}")
    cells, score_time = [], {}
    for name in names:
        t0 = _clock()
        selection = presses.Selection(parent, scorers[name])
        selection.scores  # noqa: B018 - scored once here, so that the first fork's time is the fork's alone
        score_time[name] = _since(t0)
        progress(f"ours     {name:8s} scores   {shown(score_time[name])}")
        for p in fractions:
            t0 = _clock()
            child = selection.fork("flat", p)
            answers = [tokenizer.decode(child.answer(q, max_new_tokens).tokens, skip_special_tokens=True)
                       for q in question_ids]
            child.release()
            cells.append({"press": name, "p": p, **_since(t0), "answers": answers})
            progress(f"ours     {name:8s} p={p:<6} {shown(cells[-1])} (fork + answers)")
    held = {"parent_kv_bytes": parent.kv_nbytes,  # what the parent holds while its children are forked
            "evidence_bytes": sum(t.nbytes for t in parent.evidence.window_hidden.values())}
    return {"cells": cells, "prefill": prefill_time, "scores": score_time, **held}


def _clock() -> tuple[float, float]:
    """Wall and CPU clocks now: the CPU time of this (single-threaded) process is what other sessions' load on a
    shared machine disturbs least."""
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> dict:
    return {"seconds": time.perf_counter() - start[0], "cpu_seconds": time.process_time() - start[1]}


def shown(times: dict) -> str:
    return f"{times['seconds']:.2f} s wall, {times['cpu_seconds']:.2f} s CPU"


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def measure_side(args) -> dict:
    """Build the model and workload, reset the peak resident set, run one side; its numbers as a dict."""
    torch.set_num_threads(args.threads)
    model = build_model(args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim, args.seed)
    tokenizer = build_tokenizer()
    work = workload(tokenizer, args.context, args.questions, args.question_chars, args.seed)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS, so that the peak is this side's work
    before = _status_kib("VmRSS")
    t0 = _clock()
    run = run_kvpress if args.side == "kvpress" else run_ours
    result = run(model, tokenizer, work, args.presses, args.keep, args.answer_tokens)
    result.update(side=args.side, total=_since(t0), rss_before_kib=before,
                  peak_rss_kib=_status_kib("VmHWM"))
    return result


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def equal_norm_fraction(model, ids: torch.Tensor, layer: int = 0) -> float:
    """Fraction of layer ``layer``'s keys whose norm (Knorm's score) equals another key's of the same head."""
    keys = uncompressed_keys(model, ids)[layer]
    norms = torch.linalg.vector_norm(keys, dim=-1)  # kvpress's Knorm, up to its sign
    tied = 0
    for head in norms:
        counts = torch.unique(head, return_counts=True)[1]
        tied += int(counts[counts > 1].sum())
    return tied / norms.numel()


# ---- where the time goes ---------------------------------------------------------------------------------------
def components(model, tokenizer, work, name: str, keep_fraction: float, answer_tokens: int, repeats: int = 3):
    """Median CPU seconds of each side's parts, measured apart: kvpress's compressed prefill (its hooks, as its
    pipeline runs them) and one answer (its pipeline's own ``generate_answer``); this project's prefill with the
    presses' evidence and one answer from a fork. The question is the first of ``work``; the cache is at
    ``keep_fraction`` with ``kvpress:<name>``."""
    ids, _, _, questions_ids = work
    question, n = questions_ids[0], ids.numel()

    def median(run) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.process_time()
            run()
            times.append(time.process_time() - t0)
        return sorted(times)[len(times) // 2]

    press = kvpress_press(name, keep_fraction)
    cache = kvpress_prefill(model, ids, press)[0]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    kept = cache.get_seq_length()

    def kvpress_answer():
        with torch.no_grad():
            pipe.generate_answer(question[None], cache, n, answer_tokens)
        cache.crop(kept)  # what the pipeline's _remove_answer_from_cache does, for every layer alike

    scorer = presses.get(f"kvpress:{name}")
    parent = prefill(model, ids, protected=0, evidence=scorer.evidence(None))
    child = presses.Selection(parent, scorer).fork("flat", keep_fraction)
    return {
        "kvpress prefill (compressed)": median(lambda: kvpress_prefill(model, ids, kvpress_press(name, keep_fraction))),
        "this project's prefill (with evidence)": median(
            lambda: prefill(model, ids, protected=0, evidence=scorer.evidence(None)).release()),
        f"kvpress answer ({answer_tokens} tokens)": median(kvpress_answer),
        f"this project's answer ({answer_tokens} tokens)": median(lambda: child.answer(question, answer_tokens)),
    }
