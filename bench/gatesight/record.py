"""``bench label``: prefill each corpus document once, sample continuations, store GDN signals and utility labels.

One safetensors shard per document (``<corpus>--<doc>.safetensors``): ``signals.<gdn layer>`` ``[n, Hv, 3]``
(float16) and ``labels.<attention layer>`` ``[H_kv, n]`` (max-normalised), for the n context tokens after the
chat prefix; metadata: corpus, document, checks, weights (fingerprint of the model that produced them). Existing
shards of the same weights are skipped, so a killed run resumes; shards of other weights are refused.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from runtime import CHATML_ASSISTANT_TURN, EvidenceRequest, encode_text, prefill

from ..corpus import SOURCES, documents
from .labels import Sampler, max_normalise, utility_labels

CHAT_PREFIX = "<|im_start|>user\n"


def corpus_windows(tokenizer, tokens: int = 1024, per_document: int = 2, limit: int | None = None):
    """``(corpus, doc_id, text)`` windows of about ``tokens`` tokens from the held-out generic documents, taken
    round-robin over the corpora so that any ``limit`` still covers every corpus."""
    per_source = []
    for source in SOURCES:
        windows = []
        for path, text in documents(source, "heldout"):
            ids = encode_text(tokenizer, text)
            for k in range(per_document):
                window = ids[k * tokens : (k + 1) * tokens]
                if len(window) < tokens // 2:
                    break
                # the parent folder keeps ids unique: many license files are all called "copyright"
                doc = f"{Path(path).parent.name}.{Path(path).stem}-{k}"
                windows.append((source, doc, tokenizer.decode(window)))
        per_source.append(windows)
    out = [w for group in itertools.zip_longest(*per_source) for w in group if w is not None]
    return out[:limit] if limit else out


def label_document(model, tokenizer, text: str, continuations: int = 4, max_new_tokens: int = 128,
                   seed: int = 0, check_entries: int = 8):
    """Signals ``{gdn layer: [n, Hv, 3]}``, normalised labels ``{attention layer: [H_kv, n]}`` and the checks."""
    encode = lambda s: encode_text(tokenizer, s)  # noqa: E731
    prefix, body, suffix = encode(CHAT_PREFIX), encode(text), encode(CHATML_ASSISTANT_TURN)
    ids = torch.tensor(prefix + body + suffix)
    parent = prefill(model, ids, protected=len(prefix), evidence=EvidenceRequest(gdn_signals=True), tokenizer=tokenizer)
    sampled = []
    for m in range(continuations):
        sampler = Sampler(seed=seed * 1000 + m)
        first = sampler(parent.last_logits)
        rest = parent.answer(torch.tensor([first]), max_new_tokens - 1, tokenizer.eos_token_id, choose=sampler).tokens
        sampled.append(torch.tensor([first] + rest))
    n_all = len(prefix) + len(body)
    labels, checks = utility_labels(parent, sampled, n_all, check_entries=check_entries, seed=seed)
    context = slice(len(prefix), n_all)
    signals = {layer: s[context] for layer, s in parent.evidence.gdn_signals.items()}
    labels = max_normalise({layer: u[:, context] for layer, u in labels.items()})
    parent.release()
    return signals, labels, checks


def record_corpus(model, tokenizer, out: Path, limit: int | None = None, tokens: int = 1024,
                  continuations: int = 4, max_new_tokens: int = 128, seed: int = 0, weights: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    windows = corpus_windows(tokenizer, tokens, limit=limit)
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            theirs = f.metadata().get("weights", "unknown")
        if theirs != weights:
            raise ValueError(f"{path} was labelled with other model weights ({theirs}, this model is {weights}); "
                             "label into a new --out directory")
    paths = []
    worst = 0.0
    for corpus, doc, text in tqdm(windows, desc="label", unit="doc"):
        path = out / f"{corpus}--{doc}.safetensors"
        paths.append(path)
        if path.exists():
            continue
        signals, labels, checks = label_document(model, tokenizer, text, continuations, max_new_tokens, seed)
        if checks.max_closed_form_error > 1.4e-5 or not checks.covered:
            raise RuntimeError(f"label checks failed on {corpus}/{doc}: {checks}")
        worst = max(worst, checks.max_closed_form_error)
        tensors = {f"signals.{k}": v.half().contiguous() for k, v in signals.items()}
        tensors |= {f"labels.{k}": v.float().contiguous() for k, v in labels.items()}
        meta = {"corpus": corpus, "document": doc, "checks": json.dumps(checks.__dict__), "weights": weights}
        save_file(tensors, str(path.with_suffix(".tmp")), metadata=meta)
        path.with_suffix(".tmp").replace(path)
    print(f"{len(paths)} documents labelled in {out}; worst closed-form vs deletion error this run: {worst:.2e}")
    return paths


def load_shard(path: Path) -> dict:
    """``{"corpus", "document", "signals": {layer: [n, Hv, 3] float32}, "labels": {layer: [H_kv, n]}}``."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        signals = {int(k.split(".")[1]): f.get_tensor(k).float() for k in f.keys() if k.startswith("signals.")}
        labels = {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys() if k.startswith("labels.")}
    return {"corpus": meta["corpus"], "document": meta["document"], "signals": signals, "labels": labels}
