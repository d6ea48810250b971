"""``bench label``: prefill each labelling window once, run its futures, store GDN signals and utility labels.

Two kinds of future are labelled from the same prefill (paper Eq. 2 for both, only the future tokens differ):

- ``labels``: the paper's recipe, M continuations sampled from the model itself (App. B);
- ``reconstruction``: one teacher-forced future in which the user asks for the text back and the assistant repeats
  the window — a question-free stand-in for the later questions that retrieve facts from it (the future KVzip's
  scores answer to, here only as a training target: nothing of it runs at serving time).

One safetensors shard per window (``<corpus>--<doc>.safetensors``): ``signals.<recurrent layer>`` ``[n, Hv, 3]``
(float16), ``labels.<attention layer>`` and (unless labelled with ``--futures labels``) ``reconstruction.<attention
layer>`` ``[H_kv, n]`` (max-normalised), for the n context tokens after the chat prefix, with ``scale.<kind>.<attention
layer>`` ``[H_kv]`` the normaliser of each (label kind, KV head) — the raw utility's maximum, so that the raw
utilities (one scale across layers: a change of the residual stream) are label × scale; metadata: corpus, document,
checks, weights (fingerprint of the model that produced them), settings (:func:`label_settings`, JSON: the dtype
the model computed in among them), seconds. Existing shards of the same weights and settings are skipped, so a
killed run resumes; shards of other weights or settings are refused, and so is a label directory that mixes them
when it is read (:func:`check_shards`), and a shard that cannot be read is named as damaged. A model without
recurrent layers (GDN or Mamba2) has no signals to label: it is refused before any window is labelled.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from artifacts.files import set_default_mode
from artifacts.outputs import LABEL_SHARDS
from runtime import CHATML_ASSISTANT_TURN, EvidenceRequest, adapter_for, encode_text, prefill
from runtime.batch import PaddedBatch
from runtime.errors import UsageError, check_regular_file
from workloads.corpus import LABEL_SOURCES, content_digest, label_documents

from .labels import CLOSED_FORM_TOLERANCE, LabelChecks, Sampler, max_normalise, utility_labels

CHAT_PREFIX = "<|im_start|>user\n"
RECONSTRUCTION_REQUEST = "<|im_end|>\n<|im_start|>user\nRepeat the text above word for word." + CHATML_ASSISTANT_TURN
FUTURES = ("labels", "reconstruction")
"""The label kinds of a shard: sampled continuations (the paper's), the reconstruction future."""

SHARD_FILES = LABEL_SHARDS.files[0]
"""The names of label shards, ``<corpus>--<doc>.safetensors`` (one per window, :func:`record_corpus` writes
them): what readers glob, so that no other safetensors file beside them (a delta's ``mixers.safetensors``) is
read as one."""


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
        ``both`` (:data:`FUTURES`) or ``labels``: the sampled continuations alone (the paper's recipe), without the
        reconstruction future (about a third of a window's cost on SmolLM2's hybrid).

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
    """Label every window of :func:`corpus_windows` into ``out``, one shard per window (the module docstring's
    format); shards already there are kept, so a killed run resumes.

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


def _settings_text(settings: dict | None, keys) -> str:
    """``settings`` as ``key=value``, over ``keys`` (those of both sides compared: one not recorded says so)."""
    if settings is None:
        return "settings not recorded: labelled before shards recorded them"
    return ", ".join(f"{k}={settings[k]}" if k in settings else f"{k} not recorded" for k in keys)


def labelled_futures(futures: str) -> tuple[str, ...]:
    """The label kinds ``bench label --futures`` stores: ``both`` (:data:`FUTURES`) or ``labels`` alone."""
    if futures not in ("both", "labels"):
        raise UsageError(f"futures={futures!r}: label both futures or the sampled ones alone (labels)")
    return FUTURES if futures == "both" else ("labels",)


def label_settings(weights: str, tokens: int, continuations: int, max_new_tokens: int, seed: int,
                   futures: str = "both", dtype: str = "float32") -> dict:
    """What a shard labelled with these records (:func:`shard_settings` reads it back): the weights' fingerprint,
    and what its labels depend on besides them: the window's length, the number, length and seed of the sampled
    continuations, the futures labelled (``bench label``'s flags of the same names), and the dtype the model
    computed in (``--dtype``: bfloat16 samples other continuations and rounds the utilities otherwise)."""
    labelled_futures(futures)
    for flag, value, least in (("--tokens", tokens, 1), ("--continuations", continuations, 1),
                               ("--max-new-tokens", max_new_tokens, 2)):
        if value < least:
            raise UsageError(f"{flag} {value}: give at least {least} (a window of at least 1 token, at least 1 "
                             "continuation of at least 2 tokens)")
    return {"weights": weights, "settings": {"tokens": tokens, "continuations": continuations,
                                             "max_new_tokens": max_new_tokens, "seed": seed, "futures": futures,
                                             "dtype": dtype}}


@contextmanager
def _open_shard(path: Path):
    """``safe_open`` of a label shard; one that cannot be read (cut short, overwritten) is a
    :class:`~runtime.errors.UsageError` naming it as damaged."""
    check_regular_file(path, "a label shard")
    try:
        with safe_open(str(path), "pt") as f:
            yield f
    except (SafetensorError, OSError) as error:
        reason = " ".join(str(error).split())
        raise UsageError(f"{path}: a damaged label shard ({reason}); delete it and label again into the same --out "
                         "(`bench label` labels the windows it lacks)") from None


def shard_settings(path: Path) -> dict:
    """``{"weights": fingerprint, "settings": {setting: value} or None}``: what a shard was labelled with
    (:func:`label_settings`; None for a shard written before shards recorded them)."""
    with _open_shard(path) as f:
        meta = f.metadata() or {}
        reconstruction = any(key.startswith("reconstruction.") for key in f.keys())
    settings = json.loads(meta["settings"]) if "settings" in meta else None
    if settings is not None:  # shards written before --futures record it by what they hold
        settings.setdefault("futures", "both" if reconstruction else "labels")
    return {"weights": meta.get("weights", "unknown"), "settings": settings}


def check_shards(paths: list[Path], expected: dict | None = None) -> None:
    """``ValueError`` naming the first shard of ``paths`` labelled with other weights or settings
    (:func:`shard_settings`) than ``expected`` (a resumed ``bench label``), or than the first shard (a label
    directory read for training): labels of different settings are never mixed."""
    if not paths:
        return
    reference, origin = (expected, "this run") if expected is not None else (shard_settings(paths[0]), paths[0])
    fix = ("label into a new --out directory" if expected is not None
           else "keep one setting's shards per directory (label each into its own --out)")
    for path in paths:
        recorded = shard_settings(path)
        differ = []
        if recorded["weights"] != reference["weights"]:
            differ.append(f"other model weights ({recorded['weights']}; {origin}: {reference['weights']})")
        if recorded["settings"] != reference["settings"]:
            keys = list(dict.fromkeys([*(reference["settings"] or {}), *(recorded["settings"] or {})]))
            differ.append(f"other settings ({_settings_text(recorded['settings'], keys)}; {origin}: "
                          f"{_settings_text(reference['settings'], keys)})")
        if differ:
            raise UsageError(f"{path} was labelled with {' and '.join(differ)}; {fix}")


def load_shard(path: Path, futures: str = "labels") -> dict:
    """``{"corpus", "document", "seconds", "signals": {layer: [n, Hv, 3] float32}, "labels": {layer: [H_kv, n]},
    "utilities": {layer: [H_kv, n]} or None}``.

    ``futures`` chooses what ``labels`` holds: ``labels`` (the paper's sampled continuations), ``reconstruction``,
    or ``both`` (their element-wise maximum: an entry is useful if either future needs it). Shards written before
    the reconstruction future have only ``labels``. ``utilities`` are the same futures' raw utilities (label ×
    scale; for ``both`` the maximum of the two raw ones), on one scale across layers and heads; None for shards
    written before they recorded their scales.
    """
    if futures not in FUTURES + ("both",):
        raise UsageError(f"futures={futures!r}: choose {', '.join(FUTURES)} or both")
    with _open_shard(path) as f:
        meta = f.metadata() or {}
        signals = {int(k.split(".")[1]): f.get_tensor(k).float() for k in f.keys() if k.startswith("signals.")}
        kinds = {kind: {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys() if k.startswith(kind + ".")}
                 for kind in FUTURES}
        scales = {kind: {int(k.split(".")[2]): f.get_tensor(k) for k in f.keys() if k.startswith(f"scale.{kind}.")}
                  for kind in FUTURES}
    if "corpus" not in meta or "document" not in meta or not kinds["labels"]:
        raise UsageError(f"{path}: not a label shard (no corpus, document or labels recorded in it); keep only "
                         "`bench label`'s shards in a label directory")
    if not signals:
        raise UsageError(f"{path} holds no recurrent-layer signals: it was labelled on a model without recurrent "
                         "layers, and GateSight learns from them; label a hybrid model")
    if futures != "labels" and not kinds["reconstruction"]:
        raise UsageError(f"{path} has no reconstruction labels (labelled before they existed): label again into a "
                         "new --out directory, or train with --futures labels")
    labels = kinds[futures] if futures != "both" else {
        layer: torch.maximum(u, kinds["reconstruction"][layer]) for layer, u in kinds["labels"].items()}
    chosen = FUTURES if futures == "both" else (futures,)
    utilities = None
    if all(set(scales[kind]) == set(kinds[kind]) for kind in chosen):
        raw = [{layer: u * scales[kind][layer][:, None] for layer, u in kinds[kind].items()} for kind in chosen]
        utilities = {layer: torch.stack([r[layer] for r in raw]).amax(0) for layer in raw[0]}
    return {"corpus": meta["corpus"], "document": meta["document"], "seconds": float(meta.get("seconds", "nan")),
            "signals": signals, "labels": labels, "utilities": utilities}
