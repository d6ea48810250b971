"""A model directory read once: :class:`ModelInfo`, made where a run is planned (:func:`read`) and handed down to
what loads the model and to the presses and allocators that read its artifacts, so that no one opens its config or
hashes its weights again (``bench compare`` opens ``config.json`` once a process, and reads each weight file once
to fingerprint it and once to load it)."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from runtime import adapters
from runtime.errors import UsageError, check_regular_file
from runtime.json_text import parse_json

from .file_reads import read_whole
from .fingerprints import ModelIdentity, file_states, identity, weights_digest
from .model_files import (
    ARTIFACTS,
    METHOD_ARTIFACTS,
    MODEL_PARTS,
    check_json_files,
    matching_files,
    parse_config,
    part_files,
)
from .model_spec import ModelSpec, resolve, spec_of


@dataclass(frozen=True)
class ModelInfo:
    """What a run knows of its model before and after loading it, each read once: built by :func:`read` only.

    Attributes
    ----------
    spec : ModelSpec
        The model as asked for (its path as given, device and dtype).
    directory : Path
        Its local directory, absolute (rows record its name, and ``.`` has none).
    config : dict
        Its ``config.json`` as read (not to be changed: a transformers config is built from it by
        :meth:`transformers_config`).
    config_bytes : bytes
        That file's bytes, which its fingerprint hashes.

    The fingerprints (:attr:`identity`, :attr:`weights`) are computed when first asked for and kept: a run asks once
    before it starts its workers, which receive them with the plan.
    """

    spec: ModelSpec
    directory: Path
    config: dict
    config_bytes: bytes = field(repr=False)

    @property
    def name(self) -> str:
        """The model as rows and reports name it: its directory's name."""
        return self.directory.name

    @property
    def family(self) -> str | None:
        """``config.model_type``: the adapter that serves it (:data:`runtime.adapters.MODEL_TYPES`) if any."""
        return self.config.get("model_type")

    @property
    def dtype(self) -> str:
        """The dtype the model computes in, as rows record it: the spec's, or for ``auto`` the checkpoint's own."""
        if self.spec.dtype != "auto":
            return self.spec.dtype
        stored = self.config.get("dtype") or self.config.get("torch_dtype") or _text_config(self.config).get("dtype")
        return str(stored or "float32").removeprefix("torch.")

    @property
    def device(self) -> str:
        """The kind of device the model runs on, as rows record it (``cpu`` or ``cuda``)."""
        return self.spec.torch_device().type

    @property
    def position_limit(self) -> int | None:
        """``max_position_embeddings`` (a multimodal checkpoint's in its ``text_config``), if the config says; a
        :class:`UsageError` naming config.json where it is no positive integer (probe 27, #2: ``"x"`` failed in a
        comparison with ``--length``, and 0 advised ``--length <= 0``)."""
        limit = self.config.get("max_position_embeddings", _text_config(self.config).get("max_position_embeddings"))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise UsageError(f"{self.directory / 'config.json'}: max_position_embeddings={limit!r}: expected an "
                             "integer >= 1; copy it again from where the model came from")
        return limit

    def transformers_config(self):
        """The config transformers builds the model from, as ``AutoConfig.from_pretrained`` would make it from this
        directory (defaults filled in: a Qwen3.5 config.json without layer_types has them from
        full_attention_interval), but from :attr:`config` as read; a new object each call (a model keeps and
        changes its config). A model type no adapter serves is left to transformers to read (loading it says why
        the bench cannot run it)."""
        from transformers import AutoConfig, PreTrainedConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        try:  # a hand-edited config.json (no files.json to hold it to): transformers' own refusal, in one line
            if self.family not in adapters.MODEL_TYPES:
                return AutoConfig.from_pretrained(self.directory, local_files_only=True)
            # as transformers reads config.json: Infinity and NaN are stored tagged (a Bamba's time_step_limit)
            settings = PreTrainedConfig._decode_special_floats(parse_json(self.config_bytes.decode("utf-8")))
            config = CONFIG_MAPPING[self.family].from_dict(settings, name_or_path=str(self.directory))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise config_error(self.directory, error) from None
        _check_forward_settings(self.directory, config.get_text_config())
        return config

    @cached_property
    def layer_kinds(self) -> tuple[str, ...] | None:
        """One kind a layer (``attention``, ``gdn``, ``mamba2``) as the family's adapter reads them from the config
        (:meth:`runtime.ModelAdapter.layer_kinds_from`); None for a model type no adapter serves."""
        if self.family not in adapters.MODEL_TYPES:
            return None
        config = self.transformers_config().get_text_config()
        return tuple(adapters.MODEL_TYPES[config.model_type].layer_kinds_from(config))

    @property
    def attention_layers(self) -> tuple[int, ...] | None:
        """The indices of its attention layers (those a KV cache holds); None for a model type no adapter serves."""
        kinds = self.layer_kinds
        return None if kinds is None else tuple(adapters.layers_with(kinds, "attention"))

    @cached_property
    def identity(self) -> ModelIdentity:
        """The fingerprints rows record (:func:`pretrained.fingerprints.identity`), computed once; the weight files
        read whole here are checked complete as they are read, and the state of every file hashed is kept for
        :meth:`changed`."""
        self._states  # noqa: B018 - taken before the hash: a write while it reads is then a change
        return identity(self.directory, self.config, self.config_bytes)

    @cached_property
    def weights(self) -> str | None:
        """The weight files' own fingerprint (what a calibration or an estimator records it was measured on), or
        None where the directory holds none."""
        paths = part_files(self.directory, "weights", self.config)
        return weights_digest(self.directory, paths) if paths else None

    def check_json_files(self) -> None:
        """A ``UsageError`` naming the first JSON file of the directory that transformers would fail to read
        (:func:`pretrained.model_files.check_json_files`); checked once for this object and the workers it is sent
        to."""
        self._json_files_checked  # noqa: B018 - the check is the property's computation, kept once it passed

    @cached_property
    def _json_files_checked(self) -> bool:
        check_json_files(self.directory, self.config)
        return True

    @property
    def weights_read(self) -> bool:
        """Whether the weight files were read whole for a fingerprint here (:attr:`identity` or :attr:`weights`,
        computed in this process or in the one that sent this object), each safetensors file checked complete as it
        was read: the loader then need not open them to check."""
        return "identity" in self.__dict__ or "weights" in self.__dict__

    @cached_property
    def _states(self) -> dict[str, tuple]:
        """``{part or "artifacts": file_states}`` of what :attr:`identity` hashes, taken before it reads them."""
        return self._states_now()

    def _states_now(self) -> dict[str, tuple]:
        files = {part: part_files(self.directory, part, self.config) for part in MODEL_PARTS}
        return {**{part: file_states(paths) for part, paths in files.items()},
                "artifacts": file_states(matching_files(self.directory, ARTIFACTS, exclude=METHOD_ARTIFACTS))}

    def changed(self) -> list[str]:
        """The parts (``weights``, ``config``, ``tokenizer``, ``artifacts``) whose files differ now from those
        :attr:`identity` hashed: none where each file's state is as it was (a stat, no read), and where one
        moved, those whose contents hash otherwise (a copy of the same files elsewhere, a Ray worker's, is the same
        model)."""
        was = {**self.identity.parts, "artifacts": self.identity.artifacts}
        before = self._states
        now = self._states_now()
        moved = [part for part in now if now[part] != before[part]]
        if not moved:
            return []
        again = identity(self.directory)
        return [part for part in moved if {**again.parts, "artifacts": again.artifacts}[part] != was[part]]


def _text_config(config: dict) -> dict:
    """The language model's settings (multimodal checkpoints nest them under ``text_config``)."""
    return config.get("text_config") or config


def read(model: str | os.PathLike | ModelSpec | ModelInfo | None) -> ModelInfo:
    """The :class:`ModelInfo` of ``model`` (a catalogued name, a directory, a hub id, a :class:`ModelSpec`, or None
    for the shipped model): its directory resolved (:func:`pretrained.model_spec.resolve`) and its config read; one
    given is returned as it is."""
    if isinstance(model, ModelInfo):
        return model
    spec = spec_of(model)
    return read_directory(resolve(spec), spec)


def read_directory(directory: Path, spec: ModelSpec | None = None) -> ModelInfo:
    """The :class:`ModelInfo` of a model directory as it is (not resolved by name: the directory a loaded model
    came from); ``spec``: how it was asked for (default: the directory, at the default device and dtype)."""
    directory = Path(os.path.abspath(directory))
    path = directory / "config.json"
    check_regular_file(path, "the model's settings (JSON)")
    data = read_whole(path)  # the bytes the model's file record was checked on, where it was: one read
    return ModelInfo(spec or ModelSpec(str(directory)), directory, parse_config(path, data), data)


def model_of(adapter) -> ModelInfo | None:
    """The :class:`ModelInfo` of the directory ``adapter``'s model was loaded from
    (:attr:`runtime.ModelAdapter.model_dir`), read now; None for a model built in memory. For a caller that holds a
    loaded model and not the run's object (a library caller's :class:`presses.Selection`)."""
    return None if adapter.model_dir is None else read_directory(adapter.model_dir)


def _check_forward_settings(directory: Path, config) -> None:
    """A :class:`UsageError` naming a setting of ``config`` (a text config) that the bench's own forward reads and
    transformers takes unchecked, out of its range or given as ``null`` (which overrides transformers' default): a
    prefill failed or gave NaN, blamed on the weights (probe 26, #2; probe 27, #2)."""
    rope = getattr(config, "rope_parameters", None) or {}
    ropes = list(rope.values()) if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]
    given = [("rms_norm_eps", config.rms_norm_eps, math.inf)] if hasattr(config, "rms_norm_eps") else []
    given += [(key, each[key], high) for each in ropes for key, high in (("rope_theta", math.inf),
                                                                       ("partial_rotary_factor", 1.0)) if key in each]
    for key, value, high in given:
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= high
                or not math.isfinite(value)):
            raise UsageError(f"{directory / 'config.json'}: {key}={value!r}: expected a number above 0"
                             f"{'' if high == math.inf else f' and at most {high:g}'}; copy it again from where the "
                             "model came from")
    for each in ropes:  # the rotary embedding's split of a head's rotated pairs among positions' axes
        sections = each.get("mrope_section", [0, 0, 0])
        if not isinstance(sections, list) or len(sections) < 3 or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sections):
            raise UsageError(f"{directory / 'config.json'}: mrope_section={sections!r}: expected a list of three "
                             "integers >= 0 (one a position axis); copy it again from where the model came from")


def config_error(directory: Path, error: Exception) -> UsageError:
    """The one line for a ``config.json`` in ``directory`` whose settings transformers builds no configuration or
    model from (``error``: its refusal), probe 25, #3."""
    reason = " ".join(str(error).split()) or type(error).__name__
    return UsageError(f"{directory / 'config.json'}: its settings make no model transformers can build "
                      f"({type(error).__name__}: {reason}); copy it again from where the model came from")

