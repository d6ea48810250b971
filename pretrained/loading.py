"""Loading models for the bench: a local directory or a hub id from the local Hugging Face cache, on a chosen
device and dtype (default: the project's own trained hybrid, float32 on CPU, trained by :mod:`hybridmodel`). Nothing
is downloaded unless the user allows it explicitly.

:func:`load` is this module's own; the names beside it are those callers know the loader's neighbours by: which
model (:mod:`pretrained.model_spec`), its files and their checks (:mod:`pretrained.model_files`), its fingerprints
(:mod:`pretrained.fingerprints`) and the model read once (:mod:`pretrained.model_info`)."""

from __future__ import annotations

import pickle

from runtime.errors import UsageError

from .fingerprints import ModelIdentity, files_fingerprint, fingerprint, fingerprint_of_parts, identity
from .model_files import (
    MODEL_PARTS,
    check_artifact,
    check_artifacts,
    check_not_adapter,
    check_safetensors,
    check_tokenizer_files,
    part_files,
    read_config,
)
from .model_info import ModelInfo, config_error, read
from .model_spec import DEFAULT_MODEL_DIR, DEFAULT_MODEL_NAME, DTYPES, ModelSpec, resolve

__all__ = ["DEFAULT_MODEL_DIR", "DEFAULT_MODEL_NAME", "DTYPES", "MODEL_PARTS", "ModelIdentity", "ModelInfo",
           "ModelSpec", "attention_layer_count", "check_artifact", "check_artifacts", "check_not_adapter",
           "check_tokenizer_files", "dtype_name", "files_fingerprint", "fingerprint", "fingerprint_of_parts",
           "identity", "load", "part_files", "position_limit", "read", "read_config", "resolve"]


TOKENIZER_ERRORS = (OSError, ValueError, ImportError, KeyError, TypeError, AttributeError)
"""What transformers raises where a tokenizer's files are damaged or need a library that is not installed."""


def position_limit(model: str | ModelSpec | ModelInfo | None) -> int | None:
    """The model's ``max_position_embeddings`` read from its config alone (before any weight is loaded)."""
    return read(model).position_limit


def attention_layer_count(model: str | ModelSpec | ModelInfo | None) -> int | None:
    """How many attention layers the model has, from its config alone (:attr:`ModelInfo.attention_layers`); None for
    a model type no adapter serves (loading it says why)."""
    layers = read(model).attention_layers
    return None if layers is None else len(layers)


def dtype_name(model: str | ModelSpec | ModelInfo | None) -> str:
    """The dtype the model computes in, as rows record it: the spec's, or for ``auto`` the checkpoint's own."""
    return read(model).dtype


def load(model: str | ModelSpec | ModelInfo | None = None):
    """``(model, tokenizer, directory)`` in eval mode, on the spec's device and dtype; ``model`` read once
    (:func:`pretrained.model_info.read`: a :class:`ModelInfo` given is not read again, and transformers builds the
    model and its tokenizer from its config as read). A damaged or missing file of the model directory is a
    ``ValueError`` / ``FileNotFoundError`` naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = read(model)
    spec, directory = info.spec, info.directory
    check_not_adapter(directory)
    for path in part_files(directory, "weights", info.config):
        if path.suffix == ".safetensors" and not info.weights_read:  # else checked as its fingerprint read it
            check_safetensors(path)
        elif path.suffix == ".bin" and path.stat().st_size == 0:
            raise UsageError(f"{path}: an empty weight file; copy it again from where the model came from")
    check_tokenizer_files(directory)
    info.check_json_files()
    dtype = "auto" if spec.dtype == "auto" else DTYPES[spec.dtype]
    config = info.transformers_config()
    try:
        # a tensor of another shape than the config makes is named below (transformers' own error points at a
        # report its logging hides)
        loaded, loading_info = AutoModelForCausalLM.from_pretrained(
            directory, config=config, dtype=dtype, local_files_only=True, output_loading_info=True,
            ignore_mismatched_sizes=True)
    # what the model's build raises on a setting no weight file decides (head_dim 0, an unknown activation or RoPE
    # type, a vocabulary smaller than its padding id): probe 25, #3 and probe 26, #2
    except (ZeroDivisionError, AssertionError, KeyError, AttributeError) as error:
        raise config_error(directory, error) from None
    # a PyTorch checkpoint (.bin) cut, damaged or not a state dict; a weight file transformers cannot take
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        reason = " ".join(str(error).split()) or "cut short"
        if isinstance(error, RuntimeError) and "allocate" in reason:  # the sizes config.json asks for (probe 27, U2)
            raise UsageError(f"{directory}: its config.json makes a model larger than this machine can hold "
                             f"({reason}); copy it again from where the model came from") from None
        raise UsageError(f"{directory}: its weights could not be read ({type(error).__name__}: {reason}), or its "
                         "config.json does not fit them; copy the model again from where it came from") from None
    mismatched = sorted(loading_info["mismatched_keys"])
    if mismatched:  # transformers would give these tensors random values (probe 26, U1: blamed on the weights)
        key, stored, made = mismatched[0]
        raise UsageError(f"{directory}: its config.json does not fit its weights ({key} is {list(stored)} in the "
                         f"weight files, {list(made)} as config.json makes it); one of them changed since the model "
                         "was made: copy the model again from where it came from")
    missing = sorted(loading_info["missing_keys"])
    if missing:  # transformers would fill them with random values, another model each run
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UsageError(f"{directory}: its weight files lack {len(missing)} of the tensors its config.json makes "
                         f"({shown}); one of them changed since the model was made: copy the model again from where "
                         "it came from")
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, config=config, local_files_only=True)
    except Exception as error:
        # what reading a damaged tokenizer file raises: a slow tokenizer whose library is not installed, a key or a
        # type transformers expects that is not there, or the Rust tokenizers' own parse error (a bare Exception)
        if not isinstance(error, TOKENIZER_ERRORS) and type(error) is not Exception:
            raise
        reason = " ".join(str(error).split())  # library messages span lines; the bench's error is one
        remedy = ("install the library it names" if isinstance(error, ImportError) else
                  "copy the tokenizer's files again from where the model came from")
        raise UsageError(f"{directory}: its tokenizer could not be loaded ({type(error).__name__}: {reason}); "
                         f"{remedy}") from None
    return loaded.to(spec.torch_device()).eval(), tokenizer, directory

