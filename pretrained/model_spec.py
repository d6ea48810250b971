"""Which model a run means: a :class:`ModelSpec` (a catalogued name, a local directory or a hub id, with its device
and dtype) and :func:`resolve`, its local directory (default: the project's own trained hybrid, float32 on CPU,
trained by :mod:`hybridmodel`). Nothing is downloaded unless the user allows it explicitly."""

from __future__ import annotations

import difflib
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path

import torch

import pretrained
from pretrained.file_record import RECORD_FILE
from pretrained.model_cache import SOURCE_FILE, check_recorded
from pretrained.model_name import check_model_name
from runtime.errors import MissingFileError, UsageError

MODEL_ENV = "HYBRIDPRESS_MODEL"
"""Where the default model is looked up first: a non-editable install has no source checkout beside it."""
DEFAULT_MODEL_DIR = Path(os.environ.get(MODEL_ENV)
                         or Path(__file__).resolve().parent.parent / "models" / "hybrid-byte-12l")
"""The default model: the shipped checkout's ``models/hybrid-byte-12l`` unless :data:`MODEL_ENV` names another."""
DEFAULT_MODEL_NAME = DEFAULT_MODEL_DIR.name
"""The default model's name, as its rows and the reports call it: ``--model`` takes it too."""

MODEL_NAME_MAX = 128
"""The longest model name a run takes, in characters: a model is named by its folder (:attr:`ModelInfo.name`), and
a collection names each setting group's folder ``<model>-<length>-<digest>`` (:func:`bench.store.collection.
group_folder`) in a file name of at most 255 bytes; a folder of 250 characters ran, and only ``bench publish``
failed, with the file system's "File name too long" (probe 9). As press names are bounded (:data:`runtime.options.
METHOD_NAME_MAX`); 128 is longer than any hub model's name."""

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


def spec_of(model) -> ModelSpec:
    """``model`` as a :class:`ModelSpec`: a spec as it is, a name or path with the default device and dtype."""
    return model if isinstance(model, ModelSpec) else ModelSpec(None if model is None else str(model))


def _check_named_as_recorded(directory: Path, by_env: bool = False) -> None:
    """``UsageError`` where ``directory`` (absolute, as :func:`resolve` makes it) bears a catalogued model's name or
    the default model's — the name its rows would carry — but records none of its files (no ``source.json``, no
    ``files.json``): rows of any weights would pass for that model's. ``by_env``: the directory is the default model,
    named by :data:`MODEL_ENV` rather than ``--model`` — held to the same rule (probe 12: a damaged copy without its
    record ran as the default model through the variable, and was refused through ``--model``)."""
    # the rows' own name (ModelInfo.name), not the resolved folder's: a link named like a catalogued model to a
    # folder of another name would otherwise run under the catalogue's name (probe 8, item 5)
    name = directory.name
    if name not in pretrained.CHECKPOINTS and name != DEFAULT_MODEL_NAME:
        return
    if not any((directory / record).exists() for record in (SOURCE_FILE, RECORD_FILE)):
        instead = (f"unset {MODEL_ENV} (the default model ships in the checkout)" if by_env else
                   "leave --model out (the default model ships in the checkout)" if name == DEFAULT_MODEL_NAME else
                   f"give the name, --model {name} (`bench fetch-model {name}` converts it first)")
        given = f"{MODEL_ENV}={directory}" if by_env else f"--model {directory}"
        raise UsageError(f"{given}: the folder is named {name}, the model its rows would be named after, "
                         f"but records none of its files ({SOURCE_FILE}, {RECORD_FILE}), so its weights could be any: "
                         f"{instead}, or copy the model into a folder of another name")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` can name a model of the Hugging Face hub, ``owner/name``: one ``/`` with text on each side,
    not the start of a path (``.``, ``/``, ``~``). ``smollm2-135m-hybrid/`` is none (probe 14: it was sent to the
    hub, which refused it as a repository id, read as a failed download)."""
    owner, slash, name = text.partition("/")
    return bool(slash and owner and name) and "/" not in name and not text.startswith((".", "~"))


HUB_ID = ("a hub id is owner/name, each part of ASCII letters, digits, '-', '_' and '.', at most 96 characters, "
          "starting and ending with a letter, digit or '_', without '--' or '..', and not ending in '.git'")
"""What the hub's own check of an id (``huggingface_hub.utils.validate_repo_id``) takes."""


def _check_hub_id(text: str) -> None:
    """``UsageError`` naming ``text``, an ``owner/name`` that is no local directory, where the hub's own check of an
    id refuses it (offline): such an id read as a failed download (probe 15, U3: ``Qwen/Qwen3.5 0.8B``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise UsageError(f"no model at {text!r}: no local directory, and no id the Hugging Face hub takes: "
                         f"{HUB_ID}") from None


def resolve(model: str | ModelSpec | None) -> Path:
    """The model's local directory: a catalogued name's converted directory, the path itself, or the hub id's
    snapshot in the local HF cache; its name, the model's as rows record it, at most :data:`MODEL_NAME_MAX`
    characters."""
    directory = _directory(spec_of(model))
    if len(directory.name) > MODEL_NAME_MAX:
        raise UsageError(f"model {reprlib.repr(directory.name)} in {directory.parent}: its name (its folder's, which "
                         f"its rows carry) is {len(directory.name)} characters, and a model's name is at most "
                         f"{MODEL_NAME_MAX}, so that its results' folders can be named after it; give the model a "
                         "folder of a shorter name (a link to it of a shorter name will do)")
    check_model_name(directory, known=(*pretrained.CHECKPOINTS, DEFAULT_MODEL_NAME, "hybrid-byte-12l"))
    return directory


def _directory(spec: ModelSpec) -> Path:
    """:func:`resolve`'s directory, its name not checked."""
    if spec.path is None:
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise MissingFileError(f"no model at {DEFAULT_MODEL_DIR}: the default model ships with the source "
                                    f"checkout (models/hybrid-byte-12l); set {MODEL_ENV} to its directory, or pass "
                                    "--model")
        check_recorded(DEFAULT_MODEL_DIR)  # its committed record (files.json): never run changed under its name
        if os.environ.get(MODEL_ENV):  # the checkout's own folder ships its record: read_record refuses it without
            _check_named_as_recorded(Path(os.path.abspath(DEFAULT_MODEL_DIR)), by_env=True)
        return DEFAULT_MODEL_DIR
    named = pretrained.locate(spec.path)  # a catalogued name: its converted directory, or how to fetch it
    if named is not None:
        return named
    directory = Path(spec.path).expanduser()
    if (directory / "config.json").exists():
        # absolute as ModelInfo makes it, links kept: what is checked is the folder the rows are named after and
        # the model is loaded from (`link/..` is the link's parent here, as there)
        directory = Path(os.path.abspath(directory))
        check_recorded(directory)  # a catalogued model's directory given by its path: as by its name
        _check_named_as_recorded(directory)
        return directory
    if spec.path == DEFAULT_MODEL_NAME and not directory.exists():  # as rows and reports name the default model
        return _directory(ModelSpec(None))
    if directory.exists() or not is_hub_id(spec.path):
        close = difflib.get_close_matches(spec.path, [DEFAULT_MODEL_NAME, *pretrained.CHECKPOINTS], n=3, cutoff=0.6)
        meant = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise MissingFileError(f"no model at {spec.path}: expected a local HF model directory (with config.json), a "
                               f"catalogued model's name{meant} or a hub id such as Qwen/Qwen3.5-0.8B")
    _check_hub_id(spec.path)
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

