"""Loading models for the bench: a local directory or a hub id from the local Hugging Face cache, on a chosen
device and dtype (default: the project's own trained hybrid, float32 on CPU, trained by :mod:`hybridmodel`). Nothing
is downloaded unless the user allows it explicitly."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

import pretrained
from pretrained.model_cache import check_recorded
from runtime import adapters
from runtime.errors import MissingFileError, UsageError, check_regular_file, describe

MODEL_ENV = "HYBRIDPRESS_MODEL"
"""Where the default model is looked up first: a non-editable install has no source checkout beside it."""
DEFAULT_MODEL_DIR = Path(os.environ.get(MODEL_ENV)
                         or Path(__file__).resolve().parent.parent / "models" / "hybrid-byte-12l")
"""The default model: the shipped checkout's ``models/hybrid-byte-12l`` unless :data:`MODEL_ENV` names another."""
DEFAULT_MODEL_NAME = DEFAULT_MODEL_DIR.name
"""The default model's name, as its rows and the reports call it: ``--model`` takes it too."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = "cpu, cuda, cuda:N or auto"


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how.

    Attributes
    ----------
    path : str or None
        A catalogued pretrained model's name (:data:`pretrained.CHECKPOINTS`, e.g. ``smollm2-135m-instruct``,
        converted once by ``bench fetch-model``), a local model directory, a hub id (``Qwen/Qwen3.5-0.8B``) found in
        the local Hugging Face cache, or None for the shipped default model.
    device : str
        ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when available).
    dtype : str
        ``auto`` (the checkpoint's own), ``float32``, ``bfloat16`` or ``float16``.
    allow_download : bool
        Fetch a hub id that is not in the local cache (off by default: runs are offline).
    """

    path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    allow_download: bool = False

    def __post_init__(self):
        if self.path is not None and not str(self.path).strip():
            raise UsageError(f"model {self.path!r} is empty: give a model directory, a hub id or a catalogued name "
                             f"({', '.join(pretrained.CHECKPOINTS)}), or None for the default model")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; choose auto, {', '.join(DTYPES)}")
        self.torch_device()  # refuses a bad or unavailable device before anything loads

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise UsageError(f"unknown device {self.device!r}; choose {DEVICES}") from None
        if device.type not in ("cpu", "cuda"):
            raise UsageError(f"unknown device {self.device!r}; choose {DEVICES}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"device {self.device!r} was asked for, but torch sees no CUDA device on this machine")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"device {self.device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device


def _spec(model) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else ModelSpec(None if model is None else str(model))


def resolve(model: str | ModelSpec | None) -> Path:
    """The model's local directory: a catalogued name's converted directory, the path itself, or the hub id's
    snapshot in the local HF cache."""
    spec = _spec(model)
    if spec.path is None:
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise MissingFileError(f"no model at {DEFAULT_MODEL_DIR}: the default model ships with the source "
                                    f"checkout (models/hybrid-byte-12l); set {MODEL_ENV} to its directory, or pass "
                                    "--model")
        return DEFAULT_MODEL_DIR
    named = pretrained.locate(spec.path)  # a catalogued name: its converted directory, or how to fetch it
    if named is not None:
        return named
    directory = Path(spec.path).expanduser()
    if (directory / "config.json").exists():
        check_recorded(directory)  # a catalogued model's directory given by its path: as by its name
        return directory
    if spec.path == DEFAULT_MODEL_NAME and not directory.exists():  # as rows and reports name the default model
        return resolve(None)
    if directory.exists() or spec.path.count("/") != 1 or spec.path.startswith((".", "/", "~")):
        raise MissingFileError(f"no model at {spec.path}: expected a local HF model directory (with config.json) "
                                "or a hub id such as Qwen/Qwen3.5-0.8B")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec.path, local_files_only=not spec.allow_download,
                                      allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken",
                                                      "*.jinja"]))
    except LocalEntryNotFoundError:
        # under HF_HUB_OFFLINE the hub refuses every fetch, so --allow-download cannot help
        remedy = ("the hub is offline because HF_HUB_OFFLINE is set: unset it to let --allow-download fetch it, or "
                  "download it there first") if constants.HF_HUB_OFFLINE else (
                  "download it there first, or pass --allow-download")
        raise MissingFileError(
            f"no model at {spec.path}: it is not a local directory, and the hub id is not in the local Hugging Face "
            f"cache ({HF_HUB_CACHE}); {remedy}"
        ) from None
    except Exception as error:  # the hub's own errors (unknown repository, gated model, no network)
        raise MissingFileError(f"could not fetch {spec.path} from the Hugging Face hub: {error}") from None


def read_config(directory: Path) -> dict:
    """The model's ``config.json``; ``ValueError`` naming the file if it is not a JSON object."""
    path = Path(directory) / "config.json"
    check_regular_file(path, "the model's settings (JSON)")
    try:
        config = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: expected a JSON object of model settings, got {type(config).__name__}")
    return config


def _text_config(config: dict) -> dict:
    """The language model's settings (multimodal checkpoints nest them under ``text_config``)."""
    return config.get("text_config") or config


def position_limit(model: str | ModelSpec | None) -> int | None:
    """The model's ``max_position_embeddings`` read from its config alone (before any weight is loaded)."""
    config = read_config(resolve(model))
    return config.get("max_position_embeddings", _text_config(config).get("max_position_embeddings"))


def attention_layer_count(model: str | ModelSpec | None) -> int | None:
    """How many attention layers the model has, from its config alone, as its family's adapter reads its layer kinds
    (:meth:`runtime.ModelAdapter.layer_kinds_from`); None for a model type no adapter serves (loading it says why)."""
    from transformers import AutoConfig

    directory = resolve(model)
    if read_config(directory).get("model_type") not in adapters.MODEL_TYPES:
        return None
    # the config as transformers builds the model from it: defaults filled in (a Qwen3.5 config.json without
    # layer_types has them from full_attention_interval)
    config = AutoConfig.from_pretrained(directory, local_files_only=True).get_text_config()
    kinds = adapters.MODEL_TYPES[config.model_type].layer_kinds_from(config)
    return len(adapters.layers_with(kinds, "attention"))


def dtype_name(model: str | ModelSpec | None) -> str:
    """The dtype the model computes in, as rows record it: the spec's, or for ``auto`` the checkpoint's own."""
    spec = _spec(model)
    if spec.dtype != "auto":
        return spec.dtype
    config = read_config(resolve(spec))
    stored = config.get("dtype") or config.get("torch_dtype") or _text_config(config).get("dtype")
    return str(stored or "float32").removeprefix("torch.")


def device_name(model: str | ModelSpec | None) -> str:
    """The kind of device the model runs on, as rows record it (``cpu`` or ``cuda``)."""
    return _spec(model).torch_device().type


def check_safetensors(path: Path) -> None:
    """``ValueError`` naming ``path`` unless it is a complete safetensors file (its header and every tensor's
    bytes are there)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise UsageError(f"{path}: not a complete safetensors file ({error}); copy or write it again") from None


def check_artifacts(directory: Path) -> None:
    """``ValueError`` naming the first derived artifact (:data:`ARTIFACTS`) of a model directory that cannot be
    read: presses load them only when they score."""
    for path in _matching(Path(directory), ARTIFACTS):
        check_artifact(path)


def check_artifact(path: Path) -> None:
    """``ValueError`` naming ``path``, an artifact file (of a model directory, or of a directory an option names),
    unless it reads whole: a regular file, a complete safetensors file or JSON that parses."""
    check_regular_file(path, "an artifact's file")
    if path.suffix == ".safetensors":
        check_safetensors(path)
    else:
        try:
            json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None


def load(model: str | ModelSpec | None = None):
    """``(model, tokenizer, directory)`` in eval mode, on the spec's device and dtype. A damaged or missing file of
    the model directory is a ``ValueError`` / ``FileNotFoundError`` naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _spec(model)
    directory = resolve(spec)
    read_config(directory)
    check_not_adapter(directory)
    for path in part_files(directory, "weights"):
        if path.suffix == ".safetensors":
            check_safetensors(path)
        elif path.suffix == ".bin" and path.stat().st_size == 0:
            raise UsageError(f"{path}: an empty weight file; copy it again from where the model came from")
    check_tokenizer_files(directory)
    dtype = "auto" if spec.dtype == "auto" else DTYPES[spec.dtype]
    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True,
                                                            output_loading_info=True)
    # a PyTorch checkpoint (.bin) cut, damaged or not a state dict; a weight file transformers cannot take
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        reason = " ".join(str(error).split()) or "cut short"
        raise UsageError(f"{directory}: its weights could not be read ({type(error).__name__}: {reason}); copy "
                         "them again from where the model came from") from None
    missing = sorted(info["missing_keys"])
    if missing:  # transformers would fill them with random values, another model each run
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UsageError(f"{directory}: its weight files lack {len(missing)} of the model's tensors ({shown}); copy "
                         "them again from where the model came from")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, ImportError) as error:  # e.g. a slow tokenizer whose library is not installed
        reason = " ".join(str(error).split())  # library messages span lines; the bench's error is one
        raise UsageError(f"{directory}: its tokenizer could not be loaded ({type(error).__name__}: {reason})") from None
    return loaded.to(spec.torch_device()).eval(), tokenizer, directory


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
    if not _matching(Path(directory), VOCABULARY_FILES):
        settings = " (its tokenizer_config.json alone holds the settings, not the vocabulary)" if _matching(
            Path(directory), TOKENIZER_FILES) else ""
        raise UsageError(f"{directory}: no tokenizer vocabulary — tokenizer.json, or vocab.json with merges.txt, "
                         f"a SentencePiece *.model or a *.tiktoken file{settings}; copy it from where the model came "
                         "from")


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
(:func:`bench.code_version.method_codes`), left out of :func:`artifacts_fingerprint`, so that calibrating a new
method for a model keeps every other method's rows in their group."""


def _matching(directory: Path, patterns, exclude=()) -> list[Path]:
    excluded = {path for pattern in exclude for path in directory.glob(pattern)}
    return sorted({path for pattern in patterns for path in directory.glob(pattern) if path.is_file()} - excluded)


def _digest(directory: Path, paths) -> str:
    digest = hashlib.sha256()
    for path in paths:  # a shard an index names may lie outside the directory (``../``)
        digest.update(Path(os.path.relpath(path, directory)).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def fingerprint_of_parts(parts: dict) -> str:
    """The one fingerprint of a model's parts ``{part: fingerprint}``: what a row records as ``weights`` beside its
    ``model_parts``, and what a reader checks it against."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ModelIdentity:
    """Fingerprints of a model directory.

    Attributes
    ----------
    parts : dict
        ``{part: fingerprint}`` of the weights, config and tokenizer (:data:`MODEL_PARTS`).
    artifacts : str
        One fingerprint of what the bench derived and stores beside them (:data:`ARTIFACTS`).
    """

    parts: dict
    artifacts: str

    @property
    def weights(self) -> str:
        """One fingerprint of every part (weights, config and tokenizer; not the ``weights`` part's alone): a row's
        ``weights`` field (:func:`fingerprint_of_parts`)."""
        return fingerprint_of_parts(self.parts)

    def row_fields(self) -> dict:
        """What a result row records of the model it came from (``weights`` and ``artifacts`` are in its key)."""
        return {"weights": self.weights, "model_parts": dict(self.parts), "artifacts": self.artifacts}


def identity(directory: Path) -> ModelIdentity:
    """The :class:`ModelIdentity` of a model directory."""
    directory = Path(directory)
    parts = {part: _digest(directory, part_files(directory, part)) for part in MODEL_PARTS}
    return ModelIdentity(parts, artifacts_fingerprint(directory))


def artifacts_fingerprint(directory: Path) -> str:
    """:attr:`ModelIdentity.artifacts` alone: what the bench derived and stores beside the model (:data:`ARTIFACTS`),
    less what one method alone reads (:data:`METHOD_ARTIFACTS`)."""
    return _digest(Path(directory), _matching(Path(directory), ARTIFACTS, exclude=METHOD_ARTIFACTS))


def files_fingerprint(directory: Path, patterns) -> str:
    """Content hash of the files of ``directory`` matching ``patterns`` (globs), with their file names (not their
    folders: a calibration read from ``DIR/calibration/`` or from ``DIR`` as the older layout kept it is one)."""
    digest = hashlib.sha256()
    for path in _matching(Path(directory), patterns):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def part_files(directory: Path, part: str) -> list[Path]:
    """The files of a model directory that make one of its parts (:data:`MODEL_PARTS`), without the bench's own
    (:data:`ARTIFACTS`); the weights also in the shards a weight index names (:func:`indexed_shards`)."""
    directory = Path(directory)
    _check_regular(directory.glob(pattern) for pattern in MODEL_PARTS[part])
    files = _matching(directory, MODEL_PARTS[part], exclude=ARTIFACTS)
    if part == "weights":
        named = _named_weights(directory)
        indexes = [os.path.relpath(path, directory) for path in named if path.name.endswith(".json")]
        files = sorted({*files, *named, *indexed_shards(directory, indexes)})
    return files


def _check_regular(groups) -> None:
    """``UsageError`` naming the first path of ``groups`` (iterables of a model's files, as globs find them) that is
    neither a regular file nor a folder (a ``tokenizer/`` folder is no tokenizer file): a pipe, a socket, a device."""
    for path in (path for group in groups for path in group):
        if not path.is_dir():
            check_regular_file(path, "a model's file")


def _named_weights(directory: Path) -> list[Path]:
    """The weight file a config names in place of ``model.safetensors`` (``transformers_weights``), if it exists."""
    config = directory / "config.json"
    try:
        name = json.loads(config.read_text()).get("transformers_weights") if config.is_file() else None
    except (ValueError, AttributeError):  # read_config names a damaged config
        return []
    if name is not None and not isinstance(name, str):
        raise UsageError(f"{config}: transformers_weights is {describe(name)}, where transformers takes the name of "
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
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
            paths = [Path(directory) / shard for shard in shards]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise UsageError(f"{index}: not a weight index (JSON with a weight_map of tensor names to shard files: "
                             f"{type(error).__name__}: {error}); copy it again from where the model came from") \
                from None
        for path in paths:
            check_regular_file(path, f"a weight shard {index} names")
        found += [index, *(path for path in paths if path.is_file())]  # a subfolder too, as transformers reads
    return found


def fingerprint(directory: Path, part: str | None = None) -> str:
    """Content hash of a model directory: by default of everything that makes the model (:attr:`ModelIdentity.weights`,
    so that results of a retrained or reconfigured model never pass for the old one's); of one part if given
    (``"weights"``: the weight files alone, safetensors or PyTorch's, what a calibration, an estimator and label
    shards record)."""
    if part is None:
        return identity(directory).weights
    return _digest(Path(directory), part_files(directory, part))
