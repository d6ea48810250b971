"""Which files make a model directory, and whether each reads whole: its parts (:data:`MODEL_PARTS`: weights,
config, tokenizer), what the bench derived and keeps beside them (:data:`ARTIFACTS`), and the checks that name a
damaged or missing one before anything loads it."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from runtime.bounded_read import (
    ARTIFACT_LIMIT,
    METADATA_LIMIT,
    TOKENIZER_LIMIT,
    check_size,
    read_bounded,
    read_text_bounded,
)
from runtime.errors import UsageError, check_regular_file, describe
from runtime.json_text import parse_json

from .file_reads import read_whole


def read_config(directory: Path) -> dict:
    """The model's ``config.json``; ``ValueError`` naming the file if it is not a JSON object."""
    path = Path(directory) / "config.json"
    check_regular_file(path, "the model's settings (JSON)")
    return parse_config(path, read_whole(path))


def parse_config(path: Path, data: bytes) -> dict:
    """``data``, the bytes of the config file ``path``, as a dict; ``ValueError`` naming the file if they are not
    a JSON object."""
    try:
        config = parse_json(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: expected a JSON object of model settings, got {type(config).__name__}")
    return config


def check_safetensors(path: Path) -> None:
    """``ValueError`` naming ``path`` unless it is a complete safetensors file (its header and every tensor's
    bytes are there) that can be mapped."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise UsageError(f"{path}: not a complete safetensors file ({error}); copy or write it again") from None
    except MemoryError:  # safetensors maps the file whole: past the process's address-space limit (ulimit -v)
        raise UsageError(f"{path}: its {os.stat(path).st_size:,} bytes cannot be mapped in the address space this "
                         "process may use (ulimit -v, prlimit --as); raise the limit, or give a smaller file") from None


def check_safetensors_bytes(path: Path, data: bytes) -> None:
    """:func:`check_safetensors` on the bytes of ``path`` as a digest read them whole, opening nothing again: its
    header's length, the header, and its tensors' bytes, one after another, to the file's end."""
    reason = _incomplete(data)
    if reason is not None:
        raise UsageError(f"{path}: not a complete safetensors file ({reason}); copy or write it again")


def _incomplete(data: bytes) -> str | None:
    """Why ``data`` is no complete safetensors file, or None (the layout: an 8-byte little-endian header length,
    the JSON header, then each tensor's ``data_offsets`` span of the buffer)."""
    if len(data) < 8:
        return f"{len(data)} bytes, shorter than the header's length"
    (size,) = struct.unpack("<Q", data[:8])
    if 8 + size > len(data):
        return f"its header of {size} bytes is cut at {len(data) - 8}"
    try:
        header = parse_json(data[8:8 + size])
        spans = sorted(tuple(entry["data_offsets"]) for name, entry in header.items() if name != "__metadata__")
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        return "its header is not a safetensors header"
    end = 0
    for start, stop in spans:
        if start != end or stop < start:
            return f"its tensors' bytes are not one after another (at byte {start})"
        end = stop
    if end != len(data) - 8 - size:
        return f"its tensors take {end} bytes, the file holds {len(data) - 8 - size}"
    return None


def check_artifacts(directory: Path) -> None:
    """``ValueError`` naming the first derived artifact (:data:`ARTIFACTS`) of a model directory that cannot be
    read: presses load them only when they score."""
    for path in matching_files(Path(directory), ARTIFACTS):
        check_artifact(path)


def check_artifact(path: Path) -> None:
    """``ValueError`` naming ``path``, an artifact file (of a model directory, or of a directory an option names),
    unless it reads whole: a regular file, a complete safetensors file (of at most :data:`ARTIFACT_LIMIT` bytes, said
    by its size before safetensors maps it) or JSON that parses."""
    check_regular_file(path, "an artifact's file")
    if path.suffix == ".safetensors":
        check_size(path, ARTIFACT_LIMIT, "make the artifact again, or give its own")
        check_safetensors(path)
    else:
        try:
            parse_json(read_text_bounded(path, METADATA_LIMIT, "make the artifact again, or give its own"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None


def check_not_adapter(directory: Path) -> None:
    """``UsageError`` where ``directory`` holds a PEFT adapter (``adapter_config.json``): with peft installed,
    transformers would load another directory's base model under it, weights the fingerprint does not cover."""
    if (Path(directory) / "adapter_config.json").exists():
        raise UsageError(f"{directory}: a PEFT adapter (adapter_config.json), whose base model lies elsewhere; the "
                         "bench loads whole models: merge the adapter into its base model (peft's merge_and_unload), "
                         "save the result and give that directory")


def check_tokenizer_files(directory: Path) -> None:
    """``UsageError`` naming ``directory`` unless it holds a tokenizer's vocabulary (:data:`VOCABULARY_FILES`): the
    bench reads the tokenizer from the model directory, and its settings alone (tokenizer_config.json) are not one."""
    check_regular_file(Path(directory) / "tokenizer.json", "the tokenizer's vocabulary")
    _check_regular(Path(directory).glob(pattern) for pattern in VOCABULARY_FILES)
    if not matching_files(Path(directory), VOCABULARY_FILES):
        settings = " (its tokenizer_config.json alone holds the settings, not the vocabulary)" if matching_files(
            Path(directory), TOKENIZER_FILES) else ""
        raise UsageError(f"{directory}: no tokenizer vocabulary — tokenizer.json, or vocab.json with merges.txt, "
                         f"a SentencePiece *.model or a *.tiktoken file{settings}; copy it from where the model came "
                         "from")


def check_json_files(directory: Path, config: dict) -> None:
    """``UsageError`` naming the first JSON file transformers reads from a model directory besides ``config.json``
    (the generation config, the tokenizer's files: :data:`MODEL_PARTS`; ``config``: its config as read, which names
    none of them) that is no JSON object Python can hold: nested too deep or holding too long an integer, transformers'
    own ``json.load`` ends in a ``RecursionError`` or a bare ``ValueError``, and a list in a ``TypeError``."""
    paths = [(path, limit) for part, limit in (("config", METADATA_LIMIT), ("tokenizer", TOKENIZER_LIMIT))
             for path in part_files(directory, part, config)]
    for path, limit in paths:
        if path.suffix != ".json" or path.name == "config.json":  # config.json is the ModelInfo's, parsed already
            continue
        try:
            value = parse_json(read_whole(path, limit))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error}); copy it again from where the model came from") \
                from None
        if not isinstance(value, dict):
            raise UsageError(f"{path}: no JSON object ({type(value).__name__} at the top), where transformers reads "
                             "one; copy it again from where the model came from")


VOCABULARY_FILES = ("tokenizer.json", "vocab.*", "*.model", "*.tiktoken")
"""What holds a tokenizer's vocabulary: transformers builds a tokenizer from one of these."""
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt", "*.model",
                   "*.tiktoken")
MODEL_PARTS = {
    # the files transformers loads weights from (whole or in shards), not every *.bin a checkpoint carries
    # (training_args.bin, optimizer.bin)
    "weights": ("model*.safetensors", "pytorch_model*.bin"),
    "config": ("config.json", "generation_config.json"),
    "tokenizer": (*TOKENIZER_FILES, "chat_template.*"),
}
"""What of a model directory (its top level) changes the numbers, by the part a mismatch is reported as: the chat
template frames every task's prompt, the generation config its stop tokens."""
ARTIFACTS = ("gatesight/*.safetensors", "gatesight/*.json", "calibration/*.safetensors", "calibration/*.json",
             "calibration.safetensors")
"""What the bench derived from the weights and stores beside them (GateSight's estimator, the calibration; the
last pattern is the root file older versions wrote). Fingerprinted apart from the model: a copy without them is
the same model."""
METHOD_ARTIFACTS = ("calibration/head_shares.json",)
"""Artifacts that only one method reads (an allocator's ``model_files``): hashed into that method's code
(:func:`bench.store.code_version.method_codes`), left out of the artifacts' fingerprint, so that calibrating a new
method for a model keeps every other method's rows in their group."""


def matching_files(directory: Path, patterns, exclude=()) -> list[Path]:
    excluded = {path for pattern in exclude for path in directory.glob(pattern)}
    return sorted({path for pattern in patterns for path in directory.glob(pattern) if path.is_file()} - excluded)




def part_files(directory: Path, part: str, config: dict | None = None) -> list[Path]:
    """The files of a model directory that make one of its parts (:data:`MODEL_PARTS`), without the bench's own
    (:data:`ARTIFACTS`); the weights also in the shards a weight index names (:func:`indexed_shards`) and the file
    its config (``config``: as read, or None to read it here) names."""
    directory = Path(directory)
    _check_regular(directory.glob(pattern) for pattern in MODEL_PARTS[part])
    files = matching_files(directory, MODEL_PARTS[part], exclude=ARTIFACTS)
    if part == "weights":
        named = _named_weights(directory, config)
        indexes = [os.path.relpath(path, directory) for path in named if path.name.endswith(".json")]
        files = sorted({*files, *named, *indexed_shards(directory, indexes)})
    return files


def _check_regular(groups) -> None:
    """``UsageError`` naming the first path of ``groups`` (iterables of a model's files, as globs find them) that is
    neither a regular file nor a folder (a ``tokenizer/`` folder is no tokenizer file): a pipe, a socket, a device."""
    for path in (path for group in groups for path in group):
        if not path.is_dir():
            check_regular_file(path, "a model's file")


def _named_weights(directory: Path, config: dict | None) -> list[Path]:
    """The weight file a config (``config``: as read, or None to read it here) names in place of
    ``model.safetensors`` (``transformers_weights``), if it exists."""
    path = directory / "config.json"
    try:
        if config is None:
            config = parse_json(read_whole(path)) if path.is_file() else {}
        name = config.get("transformers_weights")
    except (ValueError, AttributeError):  # read_config names a damaged config
        return []
    if name is not None and not isinstance(name, str):
        raise UsageError(f"{path}: transformers_weights is {describe(name)}, where transformers takes the name of "
                         "the weight file (or index) to load; give one, or remove the key")
    if name is None or not (directory / name).exists():
        return []
    check_regular_file(directory / name, "the weight file config.json's transformers_weights names")
    return [directory / name]


WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""Where a sharded checkpoint maps its tensors to its shards, whatever their names (transformers loads those)."""


def indexed_shards(directory: Path, named: list[str] = ()) -> list[Path]:
    """The index files of a sharded checkpoint (:data:`WEIGHT_INDEXES`, and ``named``: one its config names, relative
    to ``directory``) and the shards their ``weight_map`` names that exist, relative to ``directory`` wherever the
    index lies, as transformers resolves them (a missing one is transformers' to name); ``UsageError`` naming an index
    that is not one, or a shard that is not a regular file."""
    found = []
    for name in dict.fromkeys([*WEIGHT_INDEXES, *named]):
        index = Path(directory) / name
        check_regular_file(index, "a weight index")
        if not index.is_file():
            continue
        data = read_bounded(index, METADATA_LIMIT, "copy it again from where the model came from")
        try:
            shards = set(parse_json(data.decode())["weight_map"].values())
            paths = [Path(directory) / shard for shard in shards]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise UsageError(f"{index}: not a weight index (JSON with a weight_map of tensor names to shard files: "
                             f"{type(error).__name__}: {error}); copy it again from where the model came from") \
                from None
        for path in paths:
            check_regular_file(path, f"a weight shard {index} names")
        found += [index, *(path for path in paths if path.is_file())]  # a subfolder too, as transformers reads
    return found


