"""The real-text haystacks, shipped: one fixed snapshot of each haystack source's prose, read on every machine alike.

A haystack of real text (``bench compare --haystack manpages``) used to read the machine's own files, so the same
task, item and seed gave another context wherever another set of packages was installed (a browser's manual page
shifts every draw after it): a published group could be neither reproduced nor carried anywhere else. The haystacks
are therefore snapshots in the package (``workloads/haystacks/<source>.jsonl.gz``), built once from the files of
:mod:`workloads.corpus`'s :data:`~workloads.corpus.HAYSTACK_SOURCES` by :func:`build` and read by :func:`sentences`.
Their bytes are part of the code every row shares (:data:`bench.code_version.RESULT_DATA`): a rebuilt snapshot
starts new setting groups.

Each line of a snapshot is one document: ``{"path": ..., "sentences": [...]}``, its prose sentences (paragraphs
joined, split after . ! ?, 12 to 400 characters, mostly letters), the first :data:`SENTENCES_PER_DOCUMENT` of them.
Documents are chosen by a hash of their path, so a machine with a few more or fewer files picks nearly the same ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path

from runtime.bounded_read import read_bounded
from runtime.errors import UsageError, check_regular_file
from runtime.gunzip import gunzip
from runtime.json_text import parse_json

from .corpus import HAYSTACK_SOURCES, documents

SNAPSHOT_LIMIT = 256 << 20
"""The most a snapshot may unpack to (the shipped ones unpack to a few MB): past it, not a snapshot this module
built (:mod:`runtime.gunzip`)."""

SNAPSHOTS = Path(__file__).with_name("haystacks")
"""Where the snapshots are: ``<source>.jsonl.gz`` per haystack source."""
DOCUMENTS = {"manpages": 1500, "nodejs-docs": 200}
"""How many documents each snapshot keeps (all of them where the source has fewer)."""
SENTENCES_PER_DOCUMENT = 60
"""A context reads a document from its first sentence on; more than this would rarely be read."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def prose_sentences(text: str) -> tuple[str, ...]:
    """The sentences of a document's plain text that read as prose (12 to 400 characters, mostly letters)."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    sentences = (s for p in paragraphs for s in _SENTENCE_END.split(p))
    return tuple(s for s in sentences if 12 <= len(s) <= 400 and sum(c.isalpha() for c in s) >= 0.6 * len(s))


def snapshot_path(source: str) -> Path:
    """The snapshot file of haystack ``source``; ``UsageError`` for a source that is not a haystack."""
    if source not in HAYSTACK_SOURCES:
        raise UsageError(f"unknown haystack {source!r}; choose generated or one of {', '.join(HAYSTACK_SOURCES)}")
    return SNAPSHOTS / f"{source}.jsonl.gz"


def check_haystack(source: str) -> None:
    """``UsageError`` unless ``source`` is a haystack source whose snapshot reads."""
    snapshot_path(source)
    snapshot(source)


@lru_cache(maxsize=None)
def snapshot(source: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(path, sentences)`` of every document of ``source``'s shipped snapshot, in path order."""
    path = snapshot_path(source)
    check_regular_file(path, f"haystack {source!r}'s snapshot")  # a pipe or a device: read for ever, never refused
    try:
        packed = read_bounded(path, SNAPSHOT_LIMIT, "restore it from git")  # packed is smaller than unpacked
        lines = gunzip(packed, SNAPSHOT_LIMIT).decode().splitlines()
        out = tuple(_document(parse_json(line)) for line in lines)
    except FileNotFoundError:
        raise UsageError(f"haystack {source!r}: its snapshot {path} is missing: restore it from git (`python -m "
                         f"workloads.haystacks {source}` builds another from this machine's files)") from None
    except (OSError, EOFError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"haystack {source!r}: its snapshot {path} is damaged ({error}); restore it from git "
                         "(git checkout -- workloads/haystacks)") from None
    if not out:
        raise UsageError(f"haystack {source!r}: its snapshot {path} holds no document")
    return out


def _document(record) -> tuple[str, tuple[str, ...]]:
    """A snapshot line's ``(path, sentences)``; ``TypeError`` unless it holds a path and a list of texts, none blank
    (a number among them would reach the tokenizer; blanks would make a context of the needle alone). A text
    without a letter or digit is blank too: zero-width spaces or NULs are not whitespace to ``str.strip`` but are
    no prose either."""
    path, sentences = record["path"], record["sentences"]
    if not (isinstance(path, str) and isinstance(sentences, list)
            and all(isinstance(s, str) and any(c.isalnum() for c in s) for s in sentences)):
        raise TypeError(f"document {str(path)[:80]!r} does not hold a path and a list of sentences (non-blank texts)")
    return path, tuple(sentences)


def sentences(source: str, count: int, rng) -> list[str]:
    """``count`` consecutive sentences of documents of ``source``'s snapshot, drawn by ``rng`` (a
    ``random.Random``): a random document from its first sentence on, then the next random document, until
    ``count`` are taken."""
    docs = snapshot(source)
    out: list[str] = []
    for _ in range(100 * count):
        if len(out) >= count:
            break
        out.extend(docs[rng.randrange(len(docs))][1][: count - len(out)])
    if len(out) < count:
        raise UsageError(f"haystack {source!r}: its snapshot gave only {len(out)} of {count} sentences")
    return out


def _rank(path: str) -> bytes:
    return hashlib.sha256(path.encode()).digest()


def build(source: str, out: Path | None = None, keep: int | None = None) -> Path:
    """Write ``source``'s snapshot from this machine's files of it (:func:`workloads.corpus.documents`): the
    ``keep`` documents (default :data:`DOCUMENTS`) of lowest path hash among those with prose, in path order."""
    out = Path(out) if out is not None else snapshot_path(source)
    keep = DOCUMENTS[source] if keep is None else keep
    found = [(path, prose_sentences(text)[:SENTENCES_PER_DOCUMENT]) for path, text in documents(source, "all")]
    chosen = sorted(sorted((d for d in found if d[1]), key=lambda d: _rank(d[0]))[:keep])
    if not chosen:
        raise UsageError(f"haystack {source!r}: this machine has none of its files to build a snapshot from")
    data = "".join(json.dumps({"path": p, "sentences": list(s)}) + "\n" for p, s in chosen).encode()
    partial = out.with_name(f".{out.name}.partial")
    partial.write_bytes(gzip.compress(data, mtime=0))
    partial.replace(out)  # whole or not at all: a reader never sees half a snapshot
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workloads.haystacks",
                                     description="rebuild a shipped haystack snapshot from this machine's files")
    parser.add_argument("sources", nargs="+", choices=HAYSTACK_SOURCES)
    for source in parser.parse_args(argv).sources:
        print(f"{source}: {build(source)}")


if __name__ == "__main__":
    main()
