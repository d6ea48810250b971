"""What the tests share, in one place: the tiny model families by kind (declared by the adapters, built by
:mod:`testing.tiny_models`), the pretrained model the ``realmodel`` tests run on, seeded token ids, a model saved as a
model directory with the byte tokenizer, and the comparison settings the bench tests start from. Fixtures built on
these: ``conftest.py``."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from runtime.adapters import layers_with
from runtime.adapters.tiny import VOCAB
from testing.tiny_models import MODELS, TINY_CONFIGS, tiny_config


def _with(mixer: str) -> list[str]:
    """The tiny families with a layer of ``mixer``, as their adapters read their configs."""
    return [name for name, (adapter, _, _) in TINY_CONFIGS.items()
            if layers_with(adapter.layer_kinds_from(tiny_config(name)), mixer)]


GDN_FAMILIES = _with("gdn")
"""Gated DeltaNet hybrids."""
MAMBA2_FAMILIES = _with("mamba2")
"""Mamba2 hybrids."""
HYBRID_FAMILIES = GDN_FAMILIES + MAMBA2_FAMILIES
DENSE_FAMILIES = [name for name in TINY_CONFIGS if name not in HYBRID_FAMILIES]
"""Attention only."""
FAMILIES = HYBRID_FAMILIES + DENSE_FAMILIES
"""Every family the runtime supports, one tiny random model each (the ``tiny`` fixture's names)."""

VARIANTS = {
    # Granite 4.0-H without experts (its MLPs the shared MLP alone, as the dense Granite 4.0-H models)
    "granitemoehybrid-dense": partial(MODELS["granitemoehybrid"], num_local_experts=0),
    # two routed experts of three per token: the batched (dense) MoE adds them in the block's own order
    "granitemoehybrid-top2": partial(MODELS["granitemoehybrid"], num_local_experts=3, num_experts_per_tok=2),
}
"""Other configurations of a family, by name, for the ``tiny`` fixture."""

REAL_MODEL = "smollm2-135m-instruct"
"""The catalogued pretrained model the ``realmodel`` tests run on (``bench fetch-model`` gets it once)."""


def real_model_param():
    """:data:`REAL_MODEL` as a ``family`` parameter of the runtime's invariant tests, marked ``realmodel``."""
    return pytest.param(REAL_MODEL, marks=pytest.mark.realmodel)


FAMILIES_AND_REAL_MODEL = [*FAMILIES, real_model_param()]
"""The families the runtime's invariants are held on: every tiny one, and the pretrained model where it is fetched."""


def token_ids(n: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    """``n`` token ids in ``[0, vocab)``, the same for the same seed."""
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def save_model(model, directory: Path) -> Path:
    """``model`` saved in ``directory`` with the byte tokenizer, as a model directory ``--model`` takes."""
    from hybridmodel.tokenizer import build_tokenizer

    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return Path(directory)


def save_bamba(directory: Path):
    """A tiny random Bamba (Mamba2, attention, Mamba2, attention) with the byte tokenizer's vocabulary, saved in
    ``directory`` as a hub checkpoint arrives; the model."""
    model = MODELS["bamba"](vocab_size=260, eos_token_id=257)
    save_model(model, directory)
    return model


def compare_settings(model_dir, out, **change):
    """The smallest comparison on ``model_dir``: keydiff and the full-cache baseline, flat, p = 0.5, one
    niah_single_1 context of 300 tokens, into ``out``; ``change`` replaces any field."""
    from bench.run.compare import CompareSettings

    base = dict(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5], tasks=["niah_single_1"], n=1,
                length=300, model=str(model_dir), out=out)
    return CompareSettings(**{**base, **change})


def run_cli(capsys, *argv) -> tuple[int, str]:
    """Exit code and stderr of ``bench argv``; an error must be one line, the last, ``bench <cmd>: error: ...``
    (a progress bar may come before it), and is returned alone."""
    from bench.commands.cli import main

    capsys.readouterr()
    code = main(list(map(str, argv)))
    err = capsys.readouterr().err
    if code == 2:
        last = err.splitlines()[-1]
        assert last.startswith(f"bench {argv[0]}: error: ") and err.count(": error: ") == 1, err
        return code, last
    return code, err


def copy_model(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of a model directory under the same directory name (an identity does not depend on the path)."""
    import shutil

    copy = tmp_path / "copy" / model_dir.name
    shutil.copytree(model_dir, copy)
    return copy


def truncate(path: Path) -> None:
    """Cut ``path`` to half its size, as an interrupted copy leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def stored_rows(directory) -> list[dict]:
    """The rows of the store in ``directory`` (its ``results.jsonl``), in order."""
    import json

    return [json.loads(line) for line in (Path(directory) / "results.jsonl").read_text().splitlines()]


def published_stores() -> list:
    """The committed results (``docs/results``: a collection of stores, one per setting group and method), each
    store read-only."""
    from bench.store.project_modules import ROOT
    from bench.store.result_store import open_stores

    return open_stores([ROOT / "docs" / "results"])


def published_rows() -> list[dict]:
    """Every row of the committed results (:func:`published_stores`), store after store."""
    return [row for store in published_stores() for row in store.rows]


def store_of(rows: list[dict], directory) -> Path:
    """A new store in ``directory`` holding ``rows`` (altered copies of a real run's, in tests of the checks)."""
    import json

    directory = Path(directory)
    directory.mkdir()
    (directory / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def assert_reports_refuse(capsys, store: Path, docs: Path, message: str) -> None:
    """``bench verify`` and ``bench leaderboard`` of ``store`` both refuse it with ``message``, and no leaderboard
    is written to ``docs``."""
    for argv in (["verify", store], ["leaderboard", store, "--out", docs]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and message in err, err
    assert not (Path(docs) / "leaderboard.md").exists()
