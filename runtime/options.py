"""Options of a press or an allocator (dataclass fields), typed by the field's declared type: text such as the
CLI's ``window=64`` or ``weights=1/2/3`` is parsed, values of the wrong type are refused naming the option, the
value and what is allowed. Presses and allocators share it; it imports neither. The command line's text
(:class:`EscapedText`) writes a text option with ``%XX`` escapes, as a method's label shows it.

The numbers every option and every count take (:func:`whole`, :func:`real`) are Python's or numpy's alike
(``np.int64(5)`` is 5, ``np.float32(0.5)`` is 0.5), or their text; a count is never rounded (2.5 is refused)."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import re
import reprlib
import types
import typing
from dataclasses import MISSING, fields

from .errors import ArgumentTypeError, UsageError, describe
from .user_code import run_users

BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _kind(annotation, default):
    """``bool``, ``int``, ``float``, ``str``, ``("list", element)``, or None (a type not parsed here)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(inner[0], default) if len(inner) == 1 else None
    if typing.get_origin(annotation) in (list, tuple):
        element = (typing.get_args(annotation) or (float,))[0]
        return ("list", element) if element in (int, float) else None
    if annotation in (bool, int, float, str):
        return annotation
    if annotation in (None, typing.Any) and type(default) in (bool, int, float, str):
        return type(default)  # an annotation not resolvable here: the default says the type
    return None


def written_plainly(text: str) -> bool:
    """Whether ``text`` writes its numbers in ASCII digits without ``_``: Python reads ``"２"`` as 2 and ``"2_0"`` as
    20, which no one typing a number means."""
    return text.isascii() and "_" not in text


class EscapedText(str):
    """An option's value as the command line gives it (``name[key=value,...]``, ``--press-options``): a text option's
    ``%XX`` escapes, each a byte of its UTF-8, are decoded as it is typed (:func:`unescaped`), so that text holding
    what a method's label shows escaped (``%``, ``|``, its punctuation, a newline: :func:`bench.run.specs.shown_text`)
    is written as the label shows it. An option of another type reads the text as it is; a library's plain ``str``
    is never decoded."""


ESCAPES = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
"""A run of ``%XX`` escapes: the bytes of one or more characters."""


def unescaped(text: str) -> str:
    """``text`` with each ``%XX`` escape decoded (the bytes of UTF-8 text); a ``%`` that starts none, or bytes that
    are no UTF-8 (a lone surrogate's three bytes among them, which no tokenizer takes: probe 16, #6), is a
    :class:`~runtime.errors.UsageError` saying where and how to write ``%``."""
    bad = re.search(r"%(?![0-9A-Fa-f]{2})", text)
    if bad is not None:
        raise UsageError(f"the '%' at character {bad.start() + 1} starts no %XX escape: text options take %XX "
                         "escapes (of UTF-8 bytes: %7C is '|', %0A a newline), as labels show them; write '%' itself "
                         "as %25")
    return str(ESCAPES.sub(_decoded, text))  # plain text: never decoded twice


def _decoded(run: re.Match) -> str:
    """The text of a run of ``%XX`` escapes; bytes that are no UTF-8 are a :class:`~runtime.errors.UsageError`."""
    try:
        return bytes.fromhex(run.group().replace("%", "")).decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"its escapes {run.group()} at character {run.start() + 1} are no UTF-8 text: text options "
                         "take %XX escapes of UTF-8 bytes (%7C is '|', %C3%A9 is 'é'); write '%' itself as %25"
                         ) from None


def check_unicode(text: str) -> str:
    """``text`` if it is Unicode text, which UTF-8 encodes; a lone surrogate (what Python makes of a byte of the
    command line that is no UTF-8, ``\\xff``) is a :class:`~runtime.errors.UsageError` naming its place: no
    tokenizer takes it, and KVzip's raised a TypeError only once the model had loaded (probe 16, #6)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UsageError(f"character {error.start + 1} ({text[error.start]!r}) is no Unicode character but a lone "
                         "surrogate (as a byte of the command line that is no UTF-8 is read): text options take UTF-8 "
                         "text, any character written as itself or as the %XX escapes of its UTF-8 bytes (%C3%A9 is "
                         "'é')") from None
    return text


def _from_text(value, kind):
    """``kind(value)`` of text written plainly (:func:`written_plainly`; None for text that is not one); any other
    value as it is."""
    if not isinstance(value, str):
        return value
    if not written_plainly(value):
        return None
    try:
        return kind(value.strip())
    except ValueError:
        return None


def whole(value, what: str, minimum: int | None = None, text: bool = True) -> int:
    """``value`` as an ``int``: an integer of Python or numpy (``np.int64(5)``), or its text (``"5"``; not where
    ``text`` is false, as for a library argument), of at least ``minimum``. A :class:`~runtime.errors.UsageError`
    naming ``what`` otherwise: a bool, a real (2.5, and 5.0 too: a count is never rounded) or anything else."""
    parsed = _from_text(value, int) if text else value
    if isinstance(parsed, bool) or not isinstance(parsed, numbers.Integral) or (
            minimum is not None and parsed < minimum):
        at_least = f" >= {minimum}" if minimum is not None else ""
        raise UsageError(f"{what} must be an integer{at_least}, got {value!r}".strip())
    return int(parsed)


def real(value, what: str, low: float | None = None, high: float | None = None, above: bool = False) -> float:
    """``value`` as a finite ``float``: a real of Python or numpy (``np.float32(0.5)``, integers included), or its text
    (``"0.5"``), at least ``low`` (more than it if ``above``) and at most ``high`` where given. A
    :class:`~runtime.errors.UsageError` naming ``what`` otherwise: a bool, NaN, an infinity or anything else."""
    parsed = _from_text(value, float)
    valid = not isinstance(parsed, bool) and isinstance(parsed, numbers.Real) and math.isfinite(parsed) and (
        low is None or parsed > low or (parsed == low and not above)) and (high is None or parsed <= high)
    if not valid:
        if low is None:
            bounds = "" if high is None else f" <= {high:g}"
        elif high is None:
            bounds = f" {'>' if above else '>='} {low:g}"
        else:
            bounds = f" in {'(' if above else '['}{low:g}, {high:g}]"
        raise UsageError(f"{what} must be a finite number{bounds}, got {value!r}".strip())
    return float(parsed)


def _number(value, kind):
    """``value`` as ``kind`` (an integer: :func:`whole`; a finite number: no option means anything by NaN or an
    infinity, which a class's range check such as ``> 0`` lets through), or None if it is not one; the class's own
    checks say which range it takes."""
    if kind is int:
        try:
            return whole(value, "")
        except UsageError:
            return None
    parsed = _from_text(value, float)
    finite = isinstance(parsed, numbers.Real) and not isinstance(parsed, bool) and math.isfinite(parsed)
    return float(parsed) if finite else None


def _not_finite(value) -> str | None:
    """What is wrong with ``value`` where it is NaN or an infinity (as text or a number), else None."""
    parsed = _from_text(value, float)
    if isinstance(parsed, numbers.Real) and not isinstance(parsed, bool) and not math.isfinite(parsed):
        return f"expected a finite number, got {value!r}"
    return None


def parse_option(value, kind):
    """``value`` as ``kind``; ``ValueError`` (without the option's name) saying what is allowed."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, numbers.Integral)) else None
        if text in BOOLEANS:
            return BOOLEANS[text]
        raise UsageError("expected true or false (also yes/no, 1/0)")
    if kind in (int, float):
        parsed = _number(value, kind)
        if parsed is None:
            raise UsageError("expected an integer" if kind is int else _not_finite(value) or "expected a number")
        return parsed
    if kind is str:
        if not isinstance(value, str):
            raise UsageError("expected text")
        return unescaped(check_unicode(value)) if isinstance(value, EscapedText) else check_unicode(value)
    _, element = kind
    parsed = [_number(item, element) for item in _items(value)]
    if not parsed or any(item is None for item in parsed):  # ranges: the class's own checks
        unbounded = next((message for item in _items(value) if element is float and (message := _not_finite(item))),
                         None)
        if unbounded:
            raise UsageError(unbounded)
        numbers_ = "integers" if element is int else "numbers"  # in the form it was given: the CLI's, the library's
        raise UsageError(f"expected {numbers_} separated by '/' (e.g. 1/2/3)" if isinstance(value, str) else
                         f"expected a list of {numbers_} (e.g. [1, 2, 3])")
    return parsed


def _items(value) -> list:
    """The items of a list option's value: text split at '/', a 1-D sequence or array (numpy's, torch's) as its
    items, a lone number as a list of one; ``[value]`` (refused by the caller) for anything else."""
    if isinstance(value, str):
        return value.split("/")
    if isinstance(value, (list, tuple, range)):
        return list(value)
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):  # numpy and torch arrays
        return value.tolist()
    return [value]


def shown_value(value) -> bool:
    """Whether an option a built press or allocator holds is one a label shows: a number, a text, or a list or tuple
    of numbers (an array is none, and two settings holding one compare as no truth value: probe 22, #4)."""
    if isinstance(value, (list, tuple)):
        return all(isinstance(item, numbers.Number) for item in value)
    return value is None or isinstance(value, (numbers.Number, str))


def held_as(value) -> str:
    """How a message names a held value no label shows: its type, and a list's first item that is no number."""
    kind = f"a {type(value).__module__}.{type(value).__qualname__}"
    item = next((i for i, v in enumerate(value) if not isinstance(v, numbers.Number)), None) if isinstance(
        value, (list, tuple)) else None  # probe 25, U1: "as a builtins.list" pointed at nothing
    return kind if item is None else f"{kind} whose item {item} is {held_as(value[item])}"


def typed_options(cls, name: str, options: dict, reserved: dict[str, str] | None = None) -> dict:
    """``options`` for the dataclass ``cls`` (shown as ``name``), each parsed by its field's declared type.
    An unknown option, or a value its field's type does not allow, is a ``ValueError`` naming it; so is a field of
    ``reserved`` (``{field: why it is not an option here}``), which the valid options leave out."""
    reserved = reserved or {}
    given = next((key for key in options if key in reserved), None)
    if given is not None:
        raise UsageError(f"{name}: {given} is {reserved[given]}")
    init_fields = {f.name: f for f in fields(cls) if f.init and f.name not in reserved}
    unknown = [key for key in options if key not in init_fields]
    if unknown:
        raise UsageError(f"{name} has no option {unknown[0]!r}; valid: {', '.join(init_fields) or 'none'}")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a third-party class whose annotations do not resolve: fall back to defaults
        hints = {}
    typed = {}
    for key, value in options.items():
        field = init_fields[key]
        default = field.default if field.default is not MISSING else None
        kind = _kind(hints.get(key), default)
        if kind is None and isinstance(value, EscapedText):
            kind = str  # a type not parsed here takes the value as given: the command line's is text, decoded
        try:
            typed[key] = value if kind is None else parse_option(value, kind)
        except ValueError as error:
            raise UsageError(f"{name} option {key}={value!r}: {error}") from None
    return typed


def build_with_options(cls, name: str, options: dict, kind: str):
    """``cls(**typed_options(...))``, ``cls`` a ``kind`` (``"press"``, ``"allocator"``) registered as ``name``; a field
    without a default that is not given is a ``ValueError`` too, and what a user's class raises as it is built (its
    ``__post_init__``) is a :class:`~runtime.user_code.UserCodeError` naming it."""
    typed = typed_options(cls, name, options)
    try:
        inspect.signature(cls).bind(**typed)
    except TypeError as error:  # a required field without a default, e.g. a wrapper's inner press
        raise UsageError(f"{name} cannot be built from these options: {error}") from None
    return run_users(functools.partial(cls, **typed), cls, f"{kind} {name}", "as it was built")


METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
"""A registered press's or allocator's name: what ``--press``, ``--alloc`` and ``--methods`` can give."""
METHOD_NAME_MAX = 64
"""The longest name :func:`register_in` takes, in characters (ASCII: bytes). A published method's folder is named
``<press label>--<allocator label>`` (:func:`bench.store.collection.method_folder`), and a file name holds at most
255 bytes on the file systems a collection lives on: two names of 64 leave 125 bytes for the options a label shows
(``(estimator=e924fc2a2897)``), where a 300-character name ran and only ``bench publish`` failed (probe 8, item
10). 64 is also more than any name a reader would type."""


def register_in(registry: dict, cls, base: type, kind: str, reserved: tuple[str, ...] = ("none",),
                reserved_prefix: str | None = None):
    """Add ``cls`` (a ``base`` subclass with a ``name`` of its own) to ``registry`` (``presses.register`` and
    ``allocators.register``); a :class:`~runtime.errors.UsageError` for a class that is not one, a name that is empty,
    reserved or taken by another class."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        article = "an" if base.__name__[0] in "AEIOU" else "a"
        raise UsageError(f"register takes {article} {base.__name__} subclass, got {cls!r}")
    if not isinstance(cls.name, str) or (cls.name and not METHOD_NAME.fullmatch(cls.name)):
        # a name the command line cannot give (--press splits on commas and reads brackets as options, --methods
        # splits on slashes) or a folder of the collection could not be named by
        raise UsageError(f"{cls.__name__}.name {cls.name!r}: a {kind}'s name is text of ASCII letters, digits, "
                         "'_', '-' and '.', beginning with a letter, as bench compare can name it")
    if len(cls.name) > METHOD_NAME_MAX:
        raise UsageError(f"{cls.__name__}.name {reprlib.repr(cls.name)} ({len(cls.name)} characters): a {kind}'s name "
                         f"is at most {METHOD_NAME_MAX} characters, so that its results' folder can be named after it")
    if not cls.name or cls.name in reserved or (reserved_prefix and cls.name.startswith(reserved_prefix)):
        shown = ["empty", *(repr(r) for r in reserved), *([f"'{reserved_prefix}...'"] if reserved_prefix else [])]
        raise UsageError(f"{cls.__name__}.name {cls.name!r}: give the {kind} a name of its own (not "
                         f"{', '.join(shown[:-1])} or {shown[-1]})")
    taken = registry.get(cls.name, cls)
    if taken is not cls:  # each class by its module: two modules of a user's may both name theirs (probe 23, U3)
        raise UsageError(f"{kind} name {cls.name!r} is taken by {taken.__module__}.{taken.__qualname__}: "
                         f"{cls.__module__}.{cls.__qualname__} cannot take it too; give it a name of its own")
    registry[cls.name] = cls
    return cls


def check_name(name, registry: dict, base: type, flag: str, call: str, available: list[str],
               open_prefix: str = "") -> None:
    """Refuse, before any look-up, a name ``call`` (``presses.get``, ``allocators.get``: ``registry`` of ``base``
    classes) cannot take: one that is not text, and one with bench compare's ``flag`` options in brackets
    (``perlayer[weights=1/2]``), shown as ``call`` takes them (``allocators.get('perlayer', weights=[1, 2])``).
    Names that start with ``open_prefix`` (``kvpress:``) name classes outside ``registry``: their bracket options
    are refused the same way, without the fields only the resolved class knows."""
    kind, article = base.__name__.lower(), "an" if base.__name__[0] in "AEIOU" else "a"
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{call} takes {article} {kind} name (text), one of: {', '.join(available)}; got "
                                f"{describe(name)}")
    head, bracket, body = name.partition("[")
    prefixed = bool(open_prefix) and head.startswith(open_prefix)
    if not bracket or name in registry or (head not in registry and not prefixed):
        return
    keywords = _as_keywords(body)
    if prefixed:
        these = f": for these options, {call}({head!r}, {keywords})" if keywords else ""
        raise UsageError(f"{kind} {name!r}: options in brackets are bench compare's {flag} syntax; here name the "
                         f"{kind} alone and give its options as keywords, {call}({head!r}, key=value){these}")
    valid = [f.name for f in fields(registry[head]) if f.init]
    unknown = [pair.partition("=")[0].strip() for pair in body.removesuffix("]").split(",")
               if pair.partition("=")[0].strip() not in valid]
    if keywords and unknown:  # the call shown would fail: say so instead
        these = f"; {head} has no option {unknown[0]!r} (its options: {', '.join(valid) or 'none'})"
    else:
        these = f": for these options, {call}({head!r}, {keywords})" if keywords else ""
    raise UsageError(f"{kind} {name!r}: options in brackets are bench compare's {flag} syntax; here name the {kind} "
                     f"alone and give its options as keywords, {call}({head!r}, key=value), or pass {article} "
                     f"{base.__name__} instance, {registry[head].__name__}(key=value){these}")


def _as_keywords(body: str) -> str | None:
    """Bracket options ``window=64,weights=1/2]`` as the keywords of a call, ``window=64, weights=[1, 2]``
    (numbers bare, a '/' list of numbers a list, other text quoted); None where they are not ``key=value`` pairs."""
    pairs = [pair.partition("=") for pair in body.removesuffix("]").split(",")]
    if not body.endswith("]") or any(not sep or not key.strip().isidentifier() for key, sep, _ in pairs):
        return None
    return ", ".join(f"{key.strip()}={_literal(value.strip())}" for key, _, value in pairs)


def _literal(text: str) -> str:
    """An option's text as the Python a keyword takes: ``64``, ``[1, 2]`` (``1/2``), else ``'text'``."""
    items = [item.strip() for item in text.split("/")]
    if not all(isinstance(number := _from_text(item, float), float) and math.isfinite(number) for item in items):
        return repr(text)
    return items[0] if len(items) == 1 else f"[{', '.join(items)}]"
