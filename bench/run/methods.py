"""The methods of a comparison, resolved from its settings: the ``--methods`` pairs, or every ``--press`` with every
``--alloc``, each item a :class:`~bench.run.specs.PressSpec` or :class:`~bench.run.specs.AllocatorSpec` with its
options typed by its registry; one setting named twice, however written, is refused naming both."""

from __future__ import annotations

from pathlib import Path

import allocators
import presses
from presses.registry import KVPRESS_PREFIX
from pretrained import loading
from pretrained.model_info import ModelInfo
from runtime.errors import UsageError

from ..store.row_fields import BASELINE
from .settings import CompareSettings
from .specs import (
    AllocatorSpec,
    Method,
    PressSpec,
    frozen_options,
    parse_item,
    parse_pair,
    press_name,
)


def _spec(kind, text: str, flag: str, every: dict, registry, model: ModelInfo | None = None):
    """The spec of one ``name[options]`` item, its options those in brackets and ``every`` (``--press-options`` or
    ``--alloc-options``) typed by the registry's fields; a key given both ways is refused. An option at its default
    value is left out, and so is an artifact option naming the model's own files (``gatesight[estimator=<model
    dir>/gatesight]`` is ``gatesight``): one setting, one label, however it is written."""
    name, own = parse_item(text, flag)
    if kind is PressSpec:  # kvpress:knorm and kvpress:KnormPress: one setting, one label
        name = press_name(name)
    every_flag = "--press-options" if kind is PressSpec else "--alloc-options"
    both = sorted(set(own) & set(every))
    if both:
        raise UsageError(f"{flag} {text!r}: option {both[0]!r} is given in its brackets and in {every_flag} too; "
                         "give it once")
    options = {**every, **own}
    if name.startswith(KVPRESS_PREFIX) and "compression_ratio" in options:
        raise UsageError(f"{flag} {text!r}: compression_ratio is kvpress's budget, which --keep-fractions (or "
                         "--compression-ratios) sets for every method here; leave it out")
    if name == BASELINE:
        if own:
            raise UsageError(f"{flag} {text!r}: no prune ({BASELINE}) takes no options")
        return kind(BASELINE)
    try:
        typed = registry.options_of(name, options)
    except UsageError as error:
        if not options:  # an unknown name says so itself
            raise
        # an option, named with the flag it came from (probe 17, U4): the item's own where they alone fail alike
        raise UsageError(f"{flag} {text!r}: {error}" if _fails_alike(registry, name, own, error) else
                         f"{every_flag}, for {flag} {text!r}: {error}") from None
    try:
        default = registry.get(name)
    except ValueError:  # a required option (perlayer's weights): no default build to compare with
        default = None
    reads = presses.PRESSES[name].artifact_files if kind is PressSpec and name in presses.PRESSES else {}
    # an option's held value against the default build's, not whole builds: a field the user did not give may hold
    # an array (a table made in __post_init__), which compares as no truth value (probe 24, #1); an artifact
    # option holds what it read, so its folder's fingerprint decides below
    kept = {key: value for key, value in typed.items()
            if default is None or key in reads or _held(registry.get(name, **{key: value}), name, key) != _held(
                default, name, key)}
    fingerprints = {}
    for key, (folder, patterns) in reads.items():
        if isinstance(kept.get(key), (str, Path)):
            fingerprints[key] = loading.files_fingerprint(Path(kept[key]), patterns)
            own = loading.files_fingerprint(model.directory / folder, patterns)
            if fingerprints[key] == own:  # the model's own files, which the press reads when not told: the default
                del kept[key], fingerprints[key]
    return kind(name, frozen_options(kept), frozen_options(fingerprints))


def _held(built, name: str, key: str):
    """The value of the option ``key`` that ``built`` (the press or allocator ``name``) holds, a tuple as a list: a
    ``kvpress:`` press's options are its kvpress scorer's fields."""
    held = getattr(built.press if name.startswith(KVPRESS_PREFIX) else built, key)
    return list(held) if isinstance(held, tuple) else held


def _fails_alike(registry, name: str, own: dict, error: UsageError) -> bool:
    """Whether the item's own options ``own`` alone are refused as ``error`` refused them with every method's."""
    try:
        registry.options_of(name, own)
    except UsageError as alone:
        return str(alone) == str(error)
    return False


def methods_of(settings: CompareSettings, model: ModelInfo) -> tuple[Method, ...]:
    """The compacting methods: the ``--methods`` pairs, or every press with every allocator."""
    def press(text: str, flag: str) -> PressSpec:
        return _spec(PressSpec, text, flag, settings.press_options, presses, model)

    def allocator(text: str, flag: str) -> AllocatorSpec:
        return _spec(AllocatorSpec, text, flag, settings.alloc_options, allocators)

    if settings.pairs:
        ignored = [f"{name}={value!r}" for name, value in (("presses", settings.presses),
                                                           ("allocators", settings.allocators))
                   if value and value != (["flat"] if name == "allocators" else [])]  # flat: the default
        if ignored:  # as the CLI refuses --methods beside --press/--alloc
            raise UsageError(f"pairs={settings.pairs!r} name the press and allocator of each method; "
                             f"{' and '.join(ignored)} would be ignored: give pairs with presses=[], or presses and "
                             "allocators without pairs")
        methods = []
        for pair in settings.pairs:
            press_text, allocator_text = parse_pair(pair)
            if parse_item(press_text, "--methods")[0] == BASELINE:
                raise UsageError(f"--methods {pair!r}: no prune ({BASELINE}) always runs; name compacting methods only")
            methods.append(Method(press(press_text, "--methods"), allocator(allocator_text, "--methods")))
        _refuse_twice(methods, settings.pairs, "--methods")
        return tuple(methods)
    check_nonempty(settings.presses, "--press", ", ".join(presses.available() + [BASELINE]))
    check_nonempty(settings.allocators, "--alloc", ", ".join(allocators.available()))
    press_specs = [press(text, "--press") for text in settings.presses]
    allocator_specs = [allocator(text, "--alloc") for text in settings.allocators]
    _refuse_twice(press_specs, settings.presses, "--press")
    _refuse_twice(allocator_specs, settings.allocators, "--alloc")
    return tuple(Method(p, a) for p in press_specs if p.name != BASELINE for a in allocator_specs)


def _refuse_twice(items: list, texts: list[str], flag: str) -> None:
    """One setting named twice — the same item, or one written with an option at its default value, which its
    spec leaves out (``snapkv`` and ``snapkv[window=32]``) — is refused, naming both."""
    for later, item in enumerate(items):
        first = next((k for k in range(later) if items[k] == item), None)
        if first is not None:
            raise UsageError(f"{flag} names one setting twice: {texts[first]!r} and {texts[later]!r} (both are "
                             f"{item.label}); give it once")


def registry_names(settings: CompareSettings) -> tuple[list[str], list[str]]:
    """The registry names of the compacting presses and of the allocators, read before any option is typed."""
    if settings.pairs:
        items = [parse_pair(pair) for pair in settings.pairs]
        presses_, allocators_ = [p for p, _ in items], [a for _, a in items]
    else:
        presses_, allocators_ = settings.presses, settings.allocators
    names = [parse_item(text, "--press")[0] for text in presses_]
    return [n for n in dict.fromkeys(names) if n != BASELINE], list(dict.fromkeys(
        parse_item(text, "--alloc")[0] for text in allocators_))


def check_nonempty(values: list, what: str, allowed: str) -> None:
    if not values:
        raise UsageError(f"{what} is empty; give at least one of: {allowed}")
