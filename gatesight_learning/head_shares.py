"""``bench calibrate-shares``: the head shares of the ``head_shares`` allocator, from KVzip's global top-B
allocations on calibration windows of the labelling text (:func:`gatesight_learning.record.corpus_windows`, the text
GateSight's labels are recorded on and the calibration measured on; never an evaluation task's wording or haystack).

Per window, KVzip scores the body once; for each kept fraction p of a grid the ``global`` allocator's counts give
each (attention layer, KV head) its share count / B. The shares shipped are, at each p, the mean over windows (the
allocator interpolates between the grid's fractions). How much of it is a property of the weights — the paper's
Observation 1 asks it of GDN half-lives — is the rank correlation (Spearman) of the per-head shares between
windows, recorded with them.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path
from statistics import mean, pstdev

import torch
from tqdm import tqdm

from allocators import BudgetRequest, HeadShares
from allocators.global_topk import GlobalAllocator
from allocators.head_shares import FILE
from artifacts.files import check_replaceable, install
from presses import Selection
from presses.calibration import weights_fingerprint
from presses.preparation import prepare
from pretrained import loading
from pretrained.file_record import record_again
from runtime import adapter_for, encode_text, prefill
from runtime.errors import UsageError

from .evaluate import spearman
from .record import CHAT_PREFIX, corpus_windows

KEEP_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The kept fractions the shares are calibrated at: which heads need the budget changes with p (the heads that
hold the most reach their whole body as p grows), and KVzip's scores are computed once a window, so a fine grid
costs only its allocations."""


def window_shares(parent, scores: dict[int, torch.Tensor], keep_fractions) -> torch.Tensor:
    """``[P, L·H_kv]`` each (layer, head)'s share count / B of the global top-B of ``scores`` at each kept fraction,
    layers in depth order, heads within a layer."""
    adapter = parent.adapter
    rows = []
    for p in keep_fractions:
        request = BudgetRequest(keep_fraction=p, n_body=parent.n - parent.protected, layers=adapter.attention_layers,
                                num_kv_heads=adapter.geometry.num_kv_heads, scores=scores)
        counts = GlobalAllocator().allocate(request)
        rows.append(torch.tensor([c for layer in adapter.attention_layers for c in counts[layer]],
                                 dtype=torch.float64) / request.total)
    return torch.stack(rows)


def stability(per_window: torch.Tensor) -> dict:
    """Spearman correlation of the per-head shares (``[W, L·H_kv]``, one row a window) over every pair of windows:
    mean, spread (population standard deviation), min and max, and the number of pairs."""
    rhos = [spearman(per_window[a], per_window[b]) for a, b in itertools.combinations(range(len(per_window)), 2)]
    if not rhos:
        return {"pairs": 0}
    return {"pairs": len(rhos), "spearman_mean": mean(rhos), "spearman_sd": pstdev(rhos),
            "spearman_min": min(rhos), "spearman_max": max(rhos)}


def calibrate_head_shares(model, windows: int, tokens: int, keep_fractions=KEEP_FRACTIONS,
                          replace: bool = False) -> tuple[HeadShares, Path]:
    """Calibrate a model's head shares and store them in its directory (:data:`allocators.head_shares.FILE`).

    Parameters
    ----------
    model : str, ModelSpec or None
        The model (:func:`pretrained.loading.load`).
    windows : int
        Calibration windows (round-robin over the labelling sources), >= 2 so that stability is measured.
    tokens : int
        Tokens per window, the chat prefix (protected) included.
    keep_fractions : sequence of float
        The kept fractions the shares are calibrated at (each its own set: the windows' mean).
    replace : bool
        Whether shares the directory already holds may be replaced (moved aside first).

    Returns
    -------
    tuple[HeadShares, Path]
        The shares (``provenance`` says from what, and their stability), and the file written.
    """
    if windows < 2:
        raise UsageError(f"--windows {windows}: give at least 2 (the shares' stability is measured between windows)")
    info = loading.read(model)
    directory = info.directory
    check_replaceable((directory / FILE).parent, [directory / FILE], "head shares", replace)
    model, tokenizer, directory = loading.load(info)
    weights = weights_fingerprint(directory)  # the weights the shares are measured on, as they were loaded
    adapter = adapter_for(model)
    press = prepare("kvzip", adapter, info)
    prefix = encode_text(tokenizer, CHAT_PREFIX)
    # the smallest kept fraction's budget must hold an entry a head (else its shares are 0 / 0)
    least = len(prefix) + max(16, math.ceil(0.5 / min(keep_fractions)))
    if tokens <= least:
        raise UsageError(f"--tokens {tokens}: give more than {least} (the chat prefix and a body in which p = "
                         f"{min(keep_fractions)} keeps an entry)")
    found = corpus_windows(tokenizer, tokens - len(prefix), per_document=1, limit=windows)
    if len(found) < windows:
        raise UsageError(f"--windows {windows}: the labelling sources hold {len(found)} windows of {tokens} tokens")
    per_window, names = [], []
    for corpus, doc, text in tqdm(found, desc="calibrate-shares", unit="window"):
        ids = prefix + encode_text(tokenizer, text)[: tokens - len(prefix)]
        parent = prefill(model, torch.tensor(ids), protected=len(prefix), evidence=press.evidence(adapter),
                         tokenizer=tokenizer)
        per_window.append(window_shares(parent, Selection(parent, press).scores, keep_fractions))
        names.append(f"{corpus}/{doc}")
        parent.release()
    stacked = torch.stack(per_window)  # [W, P, L·H]
    mean_shares = stacked.mean(0)  # [P, L·H]
    heads = adapter.geometry.num_kv_heads
    layers = adapter.attention_layers
    by_fraction = {p: {layer: row[i * heads : (i + 1) * heads].tolist() for i, layer in enumerate(layers)}
                   for p, row in zip(keep_fractions, mean_shares)}
    provenance = {
        "from": "KVzip scores (default options) under the global allocator: each (layer, KV head)'s count / B, "
                "averaged over windows at each kept fraction",
        "keep_fractions": list(keep_fractions), "windows": len(found), "tokens_per_window": tokens,
        "protected": len(prefix), "text": "the labelling windows (gatesight_learning.record.corpus_windows, one per "
        "document, round-robin over workloads.corpus.LABEL_SOURCES)",
        "sources": sorted({corpus for corpus, _, _ in found}), "documents": names,
        "stability": {"over windows (shares averaged over p)": stability(stacked.mean(1)),
                      **{f"over windows at p = {p}": stability(stacked[:, i]) for i, p in enumerate(keep_fractions)}},
    }
    result = HeadShares(by_fraction, provenance, weights)
    now = weights_fingerprint(directory)
    if now != weights:  # shares of the loaded weights would be put beside others (probe 10)
        raise UsageError(f"{directory}: its weights changed while the head shares were measured (fingerprint {weights} "
                         f"as loaded, {now} now): nothing was written; keep the weights as they are while "
                         f"`bench calibrate-shares --model {directory}` runs, and run it again")
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        [path] = install([result.save(Path(scratch))], (directory / FILE).parent, superseded=[directory / FILE])
    record_again(directory)
    return result, path
