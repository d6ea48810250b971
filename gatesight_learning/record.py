"""``bench label``: prefill each labelling window once, run its futures, store GDN signals and utility labels.

Two kinds of future are labelled from the same prefill (paper Eq. 2 for both, only the future tokens differ):

- ``labels``: the paper's recipe, M continuations sampled from the model itself (App. B);
- ``reconstruction``: one teacher-forced future in which the user asks for the text back and the assistant repeats
  the window — a question-free stand-in for the later questions that retrieve facts from it (the future KVzip's
  scores answer to, here only as a training target: nothing of it runs at serving time).

One safetensors shard per window, as :mod:`gatesight_learning.shards` lays it out. Existing shards of the same weights
and settings are skipped, so a killed run resumes; shards of other weights or settings are refused
(:func:`~gatesight_learning.shards.check_shards`). A model without recurrent layers (GDN or Mamba2) has no signals to
label: it is refused before any window is labelled.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from artifacts.files import set_default_mode
from runtime import CHATML_ASSISTANT_TURN, EvidenceRequest, adapter_for, encode_text, prefill
from runtime.batch import PaddedBatch
from runtime.errors import UsageError
from workloads.corpus import LABEL_SOURCES, content_digest, label_documents

from .labels import CLOSED_FORM_TOLERANCE, LabelChecks, Sampler, max_normalise, utility_labels
from .shards import FUTURES, SHARD_FILES, check_shards, label_settings, labelled_futures

CHAT_PREFIX = "<|im_start|>user\n"
RECONSTRUCTION_REQUEST = "<|im_end|>\n<|im_start|>user\nRepeat the text above word for word." + CHATML_ASSISTANT_TURN


def _document_name(path: str) -> str:
    return f"{Path(path).parent.name}.{Path(path).stem}"


def corpus_windows(tokenizer, tokens: int = 1024, per_document: int = 2, limit: int | None = None):
    """``(corpus, doc_id, text)`` windows of about ``tokens`` tokens from the labelling sources
    (:data:`workloads.corpus.LABEL_SOURCES`), taken round-robin over the sources so that any ``limit`` still covers
    every source."""
    per_source, seen = [], set()
    for source in LABEL_SOURCES:
        windows = []
        found = label_documents(source)
        # the parent folder keeps most ids unique (many license files are all called "copyright"); the few names
        # that still collide (README and README.gz) get a digest of their path
        names = Counter(_document_name(path) for path, _ in found)
        for path, text in found:
            digest = content_digest(text)
            if digest in seen:  # the same text shipped twice (templates, licenses) is labelled once
                continue
            seen.add(digest)
            name = _document_name(path)
            if names[name] > 1:
                name += "~" + hashlib.sha256(path.encode()).hexdigest()[:6]
            ids = encode_text(tokenizer, text)
            for k in range(per_document):
                window = ids[k * tokens : (k + 1) * tokens]
                if len(window) < tokens // 2:
                    break
                windows.append((source, f"{name}-{k}", tokenizer.decode(window)))
        per_source.append(windows)
    out = [w for group in itertools.zip_longest(*per_source) for w in group if w is not None]
    return out[:limit] if limit else out


def recording_chunks(tokenizer, tokens: int, chunk: int) -> tuple[list[torch.Tensor], list[str]]:
    """The first ``tokens`` tokens of the recording corpus — the labelling windows, round-robin over the labelling
    sources — as sequences of at most ``chunk`` tokens, and the sources they come from: what TriAttention's query
    statistics and the layer gate weights are measured on (paper §4.2, App. G: the recording corpus)."""
    chunks, sources, total = [], [], 0
    for corpus, _, text in corpus_windows(tokenizer, chunk, per_document=1):
        ids = encode_text(tokenizer, text)[: min(chunk, tokens - total)]
        chunks.append(torch.tensor(ids))
        sources += [corpus] if corpus not in sources else []
        total += len(ids)
        if total >= tokens:
            break
    return chunks, sources


def label_windows(model, tokenizer, texts: list[str], continuations: int = 4, max_new_tokens: int = 128,
                  seed: int = 0, check_entries: int = 8, futures: str = "both") -> list[tuple]:
    """GDN signals and the utility labels of the futures for the n tokens of each document, from one prefill each.

    The sampled futures of all the documents decode as one batch (:meth:`runtime.batch.PaddedBatch.sample`: each
    decode step reads the weights once for every future, and on a CPU decoding is bound by that read): what each
    document alone would sample, up to floating-point reassociation.

    Parameters
    ----------
    model, tokenizer
        The model labelled, and its tokenizer.
    texts : list[str]
        The documents; the chat prefix comes before each and the assistant turn after it.
    continuations, max_new_tokens : int
        The sampled futures of each document (:class:`~gatesight_learning.labels.Sampler`, seeded
        ``seed * 1000 + m``) and their length.
    seed : int
    check_entries : int
        Entries per layer and future also scored by brute-force deletion.
    futures : str
        ``both`` (:data:`~gatesight_learning.shards.FUTURES`) or ``labels``: the sampled continuations alone (the
        paper's recipe), without the reconstruction future (about a third of a window's cost on SmolLM2's hybrid).

    Returns
    -------
    list[tuple[dict, dict, dict, LabelChecks]]
        Per document: signals ``{gdn layer: [n, Hv, 3]}`` (β, g, ‖v‖), max-normalised labels of each future kind
        labelled ``{kind: {attention layer: [H_kv, n]}}``, their normalisers ``{kind: {attention layer: [H_kv]}}``
        (the raw utility's maximum per KV head), and the worst checks of them.
    """
    encode = lambda s: encode_text(tokenizer, s)  # noqa: E731
    prefix, suffix = encode(CHAT_PREFIX), encode(CHATML_ASSISTANT_TURN)
    bodies = [encode(text) for text in texts]
    parents = [prefill(model, torch.tensor(prefix + body + suffix), protected=len(prefix),
                       evidence=EvidenceRequest(recurrent_signals=True), tokenizer=tokenizer) for body in bodies]
    samplers = [Sampler(seed=seed * 1000 + m) for _ in parents for m in range(continuations)]
    members = [parent for parent in parents for _ in range(continuations)]
    first = [sampler(parent.last_logits) for sampler, parent in zip(samplers, members)]
    rest = PaddedBatch(members).sample(first, max_new_tokens - 1, tokenizer.eos_token_id, samplers)
    sampled = [torch.tensor([token] + answer.tokens) for token, answer in zip(first, rest)]
    wanted = labelled_futures(futures)
    out = []
    for k, (parent, body) in enumerate(zip(parents, bodies)):
        n_all = len(prefix) + len(body)
        context = slice(len(prefix), n_all)
        reconstruction = torch.tensor(encode(RECONSTRUCTION_REQUEST) + body)
        own = sampled[k * continuations : (k + 1) * continuations]
        labels, scales, checks = {}, {}, []
        for kind, tokens in zip(FUTURES, (own, [reconstruction])):
            if kind not in wanted:
                continue
            raw, check = utility_labels(parent, tokens, n_all, check_entries=check_entries, seed=seed)
            raw = {layer: u[:, context] for layer, u in raw.items()}
            labels[kind], scales[kind] = max_normalise(raw), {layer: u.amax(-1) for layer, u in raw.items()}
            checks.append(check)
        signals = {layer: s[context] for layer, s in parent.evidence.recurrent_signals.items()}
        parent.release()
        out.append((signals, labels, scales, LabelChecks(max(c.max_closed_form_error for c in checks),
                                                 max(c.max_reconstruction_error for c in checks),
                                                 all(c.covered for c in checks))))
    return out


def record_corpus(model, tokenizer, out: Path, limit: int | None = None, tokens: int = 1024,
                  continuations: int = 4, max_new_tokens: int = 128, seed: int = 0, weights: str = "",
                  part: tuple[int, int] = (0, 1), futures: str = "both", together: int = 4) -> list[Path]:
    """Label every window of :func:`corpus_windows` into ``out``, one shard per window (as
    :mod:`gatesight_learning.shards` lays it out); shards already there are kept, so a killed run resumes.

    Parameters
    ----------
    model, tokenizer
        The model labelled, and its tokenizer.
    out : Path
        The shard directory.
    limit : int or None
        At most this many windows.
    tokens : int
        Tokens per window.
    continuations, max_new_tokens, seed : int
        The sampled futures (:func:`label_windows`).
    weights : str
        The model's fingerprint, stored in each shard; shards of other weights in ``out`` are refused.
    part : tuple[int, int]
        ``(k, N)``: windows k, k + N, k + 2N, … only, so that N processes (cores, machines) share one corpus into
        one directory.
    futures : str
        The futures labelled (:func:`label_windows`).
    together : int
        Windows labelled at once, their sampled futures decoded as one batch (:func:`label_windows`). On SmolLM2's
        hybrid, one CPU thread beside a second job: 54 s a window alone, 38 s two at once, 33 s three, 29 s four.

    Returns
    -------
    list[Path]
        The shards of this part's windows, written now or before.

    Raises
    ------
    ValueError
        A bad ``part`` or ``together``, a model without recurrent layers, or shards of other weights or settings
        (the model's dtype among them) in ``out``.
    RuntimeError
        A window whose labels fail their checks (closed form against deletion, coverage).
    """
    index, parts = part
    if not (isinstance(index, int) and isinstance(parts, int) and 0 <= index < parts):
        raise UsageError(f"part {index}/{parts}: expected K/N with 0 <= K < N")
    check_together(together)
    adapter = adapter_for(model)
    check_recurrent(adapter)
    recorded = label_settings(weights, tokens, continuations, max_new_tokens, seed, futures,
                              str(adapter.dtype).removeprefix("torch."))
    check_shards(sorted(out.glob(SHARD_FILES)), recorded)
    limit_positions = getattr(adapter.config, "max_position_embeddings", None)
    if limit_positions is not None and tokens + max_new_tokens > limit_positions:
        raise UsageError(f"--tokens {tokens} and --max-new-tokens {max_new_tokens} need {tokens + max_new_tokens} "
                         f"positions; the model has {limit_positions} (max_position_embeddings)")
    every = corpus_windows(tokenizer, tokens, limit=limit)
    if not every:  # an exit 0 with nothing labelled would read as a finished corpus
        raise UsageError(f"--tokens {tokens}: no labelling document holds half a window of that many tokens; give "
                         "a smaller --tokens")
    out.mkdir(parents=True, exist_ok=True)
    windows = every[index::parts]
    paths = [out / f"{corpus}--{doc}.safetensors" for corpus, doc, _ in windows]
    todo = [(window, path) for window, path in zip(windows, paths) if not path.exists()]
    worst, labelled = 0.0, 0
    with tqdm(total=len(windows), initial=len(windows) - len(todo), desc="label", unit="doc") as bar:
        for group in (todo[k : k + together] for k in range(0, len(todo), together)):
            started = time.perf_counter()
            results = label_windows(model, tokenizer, [text for (_, _, text), _ in group], continuations,
                                   max_new_tokens, seed, futures=futures)
            seconds = (time.perf_counter() - started) / len(group)  # the group's time, shared by its windows
            for ((corpus, doc, _), path), (signals, labels, scales, checks) in zip(group, results):
                if checks.max_closed_form_error > CLOSED_FORM_TOLERANCE or not checks.covered:
                    raise RuntimeError(f"label checks failed on {corpus}/{doc}: {checks}")
                worst = max(worst, checks.max_closed_form_error)
                tensors = {f"signals.{k}": v.half().contiguous() for k, v in signals.items()}
                tensors |= {f"{kind}.{k}": v.float().contiguous() for kind in labels for k, v in labels[kind].items()}
                tensors |= {f"scale.{kind}.{k}": v.float().contiguous() for kind in scales
                            for k, v in scales[kind].items()}
                meta = {"corpus": corpus, "document": doc, "checks": json.dumps(checks.__dict__), "weights": weights,
                        "settings": json.dumps(recorded["settings"]), "seconds": f"{seconds:.3f}"}
                save_file(tensors, str(path.with_suffix(".tmp")), metadata=meta)
                set_default_mode(path.with_suffix(".tmp"))
                path.with_suffix(".tmp").replace(path)
                labelled += 1
            bar.update(len(group))
    # the error is of the windows this run labelled: a run that found them all labelled checked none
    checked = f"; worst closed-form vs deletion error this run: {worst:.2e}" if labelled else ""
    print(f"{labelled} documents labelled in {out} ({len(paths) - labelled} of this part's {len(paths)} were there "
          f"already){checked}")
    return paths


def check_recurrent(adapter) -> None:
    """A :class:`~runtime.errors.UsageError` unless the model of ``adapter`` has recurrent layers whose signals a
    shard records (:attr:`runtime.ModelAdapter.signal_layers`): labels without them train nothing."""
    if not adapter.signal_layers:
        model = adapter.model
        raise UsageError(f"{adapter.model_dir or type(model).__name__} has no recurrent layers "
                         f"({type(model).__name__}: attention layers only): GateSight's labels pair each attention "
                         "layer's utilities with the GDN or Mamba2 signals of the layers before it; label a hybrid")


def check_together(together: int) -> None:
    """``ValueError`` unless at least one window is labelled at a time (:func:`record_corpus`'s ``together``)."""
    if together < 1:
        raise UsageError(f"--together {together}: label at least one window at a time")
