"""Real text that exists on every machine of this kind, offline, and which role each source plays.

Three roles, declared here and nowhere else, and kept apart by ``tests/workloads/test_corpus.py`` (no document, by
path or by content, belongs to two roles):

- :data:`SOURCES` train the default model (their ``train`` split), calibrate TriAttention and the layer gate weights
  and time scoring (``bench cost``): Python's standard-library sources, license and copyright texts, the long
  descriptions of installed Python packages. Documents are split by a hash of their path: ~10 % are held out.
- :data:`LABEL_SOURCES` supply the GateSight labelling windows: the held-out split of :data:`SOURCES` (text the
  model never trained on) and every document of more sources of technical prose that nothing else reads (npm's
  manual, the Google Cloud SDK's documents, package documentation under ``/usr/share/doc``, Perl's manuals).
- :data:`HAYSTACK_SOURCES` are read only as benchmark haystacks (``bench compare --haystack``): the system's
  manual pages and Node.js's API documentation. Nothing trains, calibrates or labels on them, so a method is
  measured on text its training never saw.
"""

from __future__ import annotations

import email
import hashlib
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from runtime.bounded_read import FileTooLargeError, read_bounded
from runtime.errors import UsageError
from runtime.gunzip import gunzip

SOURCES = ("python-stdlib", "licenses", "package-docs")
"""Train the default model, calibrate, time scoring."""
EXTRA_LABEL_SOURCES = ("npm-docs", "gcloud-docs", "doc-texts", "perl-pod")
LABEL_SOURCES = SOURCES + EXTRA_LABEL_SOURCES
"""Label GateSight's estimator: the held-out split of :data:`SOURCES`, all of :data:`EXTRA_LABEL_SOURCES`."""
HAYSTACK_SOURCES = ("manpages", "nodejs-docs")
"""Benchmark haystacks only."""
DOCUMENT_LIMIT = 64 << 20
"""Bytes of one document, packed or unpacked: real ones (a manual page, a package's manual) hold kilobytes to a few
MB; a file past it is no document and is passed over, not read whole (:mod:`runtime.bounded_read`)."""
_NODEJS_DOCS = Path("/usr/share/doc/nodejs")


def _held_out(path: str) -> bool:
    return hashlib.sha256(path.encode()).digest()[0] < 26  # ~10 %


def _under(root: Path, *patterns: str) -> list[Path]:
    return sorted({p for pattern in patterns for p in root.glob(pattern)}) if root.is_dir() else []


def _package_description(text: str) -> str:
    return email.message_from_string(text).get_payload() or ""


_CODE_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)


def _markdown_prose(text: str) -> str:
    """Markdown without fenced code blocks: the prose is what a haystack or a labelling window should read."""
    return _CODE_FENCE.sub("", text)


_ROFF_ESCAPES = (
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[+-]?\d"), ""),  # size changes
    (re.compile(r"\\[hvwNo]'[^']*'"), " "),  # motions, widths
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # strings
    (re.compile(r"\\\((em|en|hy|mi)"), "-"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),  # other special characters
    (re.compile(r"\\[-&e|^ ~%c:]"), lambda m: {"\\-": "-", "\\e": "\\", "\\ ": " ", "\\~": " "}.get(m.group(0), "")),
)
_ROFF_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB", "TP", "IP", "Nm", "Nd"}


def _roff_text(source: str) -> str:
    """Plain text of a man page's roff source: section headings and running text, requests and escapes dropped."""
    lines = []
    for line in source.splitlines():
        if line.startswith((".", "'")):
            request, _, argument = line[1:].strip().partition(" ")
            if request not in _ROFF_TEXT_MACROS or not argument:
                continue
            line = argument.replace('"', "")
        for pattern, replacement in _ROFF_ESCAPES:
            line = pattern.sub(replacement, line)
        lines.append(line.strip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _read_gzip_or_text(path: Path) -> str:
    """A document's text (gzip-packed where its name ends ``.gz``), packed and unpacked each within
    :data:`DOCUMENT_LIMIT`."""
    raw = read_bounded(path, DOCUMENT_LIMIT, "not a document")
    return (gunzip(raw, DOCUMENT_LIMIT) if path.suffix == ".gz" else raw).decode("utf-8", errors="ignore")


@dataclass(frozen=True)
class TextSource:
    """Where a source's documents are and how one is turned into plain text.

    Attributes
    ----------
    files : Callable[[], list[Path]]
        The source's documents, sorted.
    read : Callable[[str], str]
        A document's raw text -> plain text (roff, markdown, package metadata).
    """

    files: Callable[[], list[Path]]
    read: Callable[[str], str] = lambda text: text


_TEXT_SOURCES = {
    "python-stdlib": TextSource(lambda: sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))),
    "licenses": TextSource(lambda: sorted([*Path("/usr/share/common-licenses").glob("*"),
                                           *Path("/usr/share/doc").glob("*/copyright")])),
    "package-docs": TextSource(lambda: sorted(Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA")),
                               _package_description),
    "npm-docs": TextSource(lambda: _under(Path("/usr/lib/node_modules/npm/docs"), "**/*.md"), _markdown_prose),
    "gcloud-docs": TextSource(lambda: _under(Path("/usr/lib/google-cloud-sdk"), "**/*.md"), _markdown_prose),
    # package documentation, Node.js's own left out: it is a haystack source
    "doc-texts": TextSource(lambda: [p for p in _under(Path("/usr/share/doc"), "*/*.txt", "*/*.md", "*/*.rst",
                                                       "*/README*", "*/*/*.txt", "*/*/*.md", "*/*/*.rst")
                                     if _NODEJS_DOCS not in p.parents], _markdown_prose),
    "perl-pod": TextSource(lambda: _under(Path("/usr/share/perl"), "**/*.pod")),
    # the Google Cloud SDK's generated command reference (most of the pages here) and Perl's module pages are left
    # out: they restate gcloud-docs and perl-pod, two labelling sources
    "manpages": TextSource(lambda: [p for p in _under(Path("/usr/share/man"), "man[1-8]/*")
                                    if not p.name.startswith(("gcloud", "bq", "gsutil", "perl"))
                                    and ".3perl" not in p.name and ".3pm" not in p.name], _roff_text),
    "nodejs-docs": TextSource(lambda: _under(_NODEJS_DOCS, "**/*.md"), _markdown_prose),
}
ALL_SOURCES = tuple(_TEXT_SOURCES)


def _reserved(path: Path) -> bool:
    """Package changelogs and GNU info manuals are kept for checks outside the project: no role reads them."""
    return "changelog" in path.name.lower() or Path("/usr/share/info") in path.parents


@lru_cache(maxsize=None)
def source_files(source: str) -> tuple[Path, ...]:
    """Every candidate file of ``source`` (listed, not read)."""
    if source not in _TEXT_SOURCES:
        raise UsageError(f"unknown text source {source!r}; choose from {', '.join(ALL_SOURCES)}")
    return tuple(p for p in _TEXT_SOURCES[source].files() if p.is_file() and not _reserved(p))


@lru_cache(maxsize=4096)
def read_document(source: str, path: Path, min_chars: int = 400) -> str | None:
    """The plain text of one file of ``source``, or None if it is not a document (unreadable, not ASCII, short)."""
    try:
        text = _TEXT_SOURCES[source].read(_read_gzip_or_text(path)).strip()
    except (OSError, EOFError, FileTooLargeError):  # unreadable, damaged (gzip's errors) or huge: no document
        return None
    return text if len(text) >= min_chars and text.isascii() else None


@lru_cache(maxsize=None)
def documents(source: str, split: str = "train", min_chars: int = 400) -> tuple[tuple[str, str], ...]:
    """``(path, text)`` of every ASCII document of ``source`` with at least ``min_chars`` characters.

    Parameters
    ----------
    source : str
        One of :data:`ALL_SOURCES`.
    split : str
        ``train`` or ``heldout`` (the ~10 % hash split of every source), or ``all``.
    """
    if split not in ("train", "heldout", "all"):
        raise UsageError(f"unknown split {split!r}; choose train, heldout or all")
    out = []
    for path in source_files(source):
        if split == "all" or _held_out(str(path)) == (split == "heldout"):
            text = read_document(source, path, min_chars)
            if text is not None:
                out.append((str(path), text))
    return tuple(out)


def content_digest(text: str) -> str:
    """SHA-256 of a document's text with whitespace normalised: the same text under another path or layout."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


def label_documents(source: str) -> tuple[tuple[str, str], ...]:
    """The documents of a labelling source: held out from the model's training for :data:`SOURCES`, all of them
    for the sources only labelling reads."""
    if source not in LABEL_SOURCES:
        raise UsageError(f"{source!r} is not a labelling source; choose from {', '.join(LABEL_SOURCES)}")
    return documents(source, "heldout" if source in SOURCES else "all")
