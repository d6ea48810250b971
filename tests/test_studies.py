"""The study scripts of ``benchmarks/`` and ``scripts/`` still regenerate the pages that name them: each is named by
a page ``docs/README.md`` indexes, and each is run here — on the committed stores where it reads stores (its page
must come out again), else at a tiny size, where what it prints must hold the invariants of its page.

The scripts run as a user runs them (``python benchmarks/X.py``), with this checkout first on the path. Those that
read SmolLM2 are marked ``realmodel`` (skipped until ``bench fetch-model smollm2-135m-instruct``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pretrained

pytestmark = pytest.mark.slow  # process-heavy: run by .ci/run beside the default run (-m slow)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

OPERATIONAL = {
    "scripts/serving_env.sh": "builds the serving environment (.ci/run)",
    "scripts/gpu_check.sh": "the GPU check, run on a lent GPU (docs/gpu_check.md)",
    "scripts/gpu_check.py": "its checks and timings",
    "scripts/shard_packs.py": "carries a sweep's shards between sessions (tests/test_shard_packs.py)",
    "scripts/label_in_parts.sh": "bench label in two processes, for gatesight_group.sh",
    "benchmarks/kvpress_side_by_side_runs.py": "the two sides kvpress_side_by_side.py runs and times",
    "benchmarks/kvpress_side_by_side_report.py": "the page kvpress_side_by_side.py writes",
}
"""Scripts that are tools of other scripts or of CI, not studies: no page of their own."""

NOT_RUN_HERE = {
    "scripts/full_sweep.sh": "the leaderboard from scratch: hours, and it writes docs/results",
    "scripts/realmodel_sweep.sh": "the leaderboard's SmolLM2 group: hours, and it writes docs/results",
    "scripts/gatesight_group.sh": "the hybrid's GateSight group: a day, and it writes docs/results",
    "scripts/hybrid_targets.sh": "a delta against its teacher: hours (its three scripts run below)",
    "scripts/rebuild_default_model.sh": "retrains the default model: hours",
    "benchmarks/serving_cost.py": "needs vLLM's own environment (scripts/serving_env.sh)",
}
"""Pipelines too long to run at any size in a test, with why; every script they call runs below."""


def studies() -> list[str]:
    scripts = sorted(ROOT.glob("benchmarks/*.py")) + sorted(ROOT.glob("scripts/*"))
    names = [str(path.relative_to(ROOT)) for path in scripts if not path.name.startswith("test_")]
    return [name for name in names if name not in OPERATIONAL]


def run(script: str, *args: str, timeout: int = 600) -> str:
    """Standard output of ``python script args`` from the checkout's root, this checkout's packages first."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def indexed_text() -> str:
    """The index and every page it links to, as one text."""
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    targets = {target.partition("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", index)}
    pages = [(DOCS / target).resolve() for target in targets if target.endswith(".md")]
    return index + "".join(page.read_text(encoding="utf-8") for page in pages if page.is_file())


@pytest.mark.parametrize("script", studies())
def test_every_study_is_named_by_a_kept_page_and_run_by_a_test(script: str) -> None:
    assert script in indexed_text(), f"{script}: no page of docs/README.md's index names it (a study makes a page)"
    tests = "".join(path.read_text(encoding="utf-8") for path in (ROOT / "tests").rglob("test_*.py"))
    assert script in NOT_RUN_HERE or tests.count(f'"{script}"') > 0, f"{script}: no test runs it"


@pytest.mark.parametrize("length", [2048, 4096])
def test_model_vs_teacher_rebuilds_its_pages(tmp_path: Path, length: int) -> None:
    """``hybrid/phase5/niah-L.md`` is exactly what the script makes of the committed teacher and model stores."""
    out = tmp_path / "niah.md"
    phase5 = DOCS / "hybrid" / "phase5"
    run("benchmarks/model_vs_teacher.py", "--teacher", str(phase5 / f"niah-{length}-smollm2-135m-instruct"),
        "--model", str(phase5 / f"niah-{length}-model"), "--out", str(out))
    assert out.read_text(encoding="utf-8") == (phase5 / f"niah-{length}.md").read_text(encoding="utf-8")


def test_paired_runs_rebuilds_the_real_text_tables() -> None:
    """Every table line of ``realtext.md``'s real-text section comes out of the script, its paired rows included."""
    page = (DOCS / "realtext.md").read_text(encoding="utf-8")
    section = page.split("## Real text (manual pages and Node.js documentation)")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    pairs = sorted({line.split(" | ")[0][2:].replace(" − ", "-") for line in lines if " − " in line})
    stores = [f"{label}={DOCS / 'realtext' / folder}"
              for label, folder in (("before", "before"), ("after", "after"), ("recipe", "after-recipe"))]
    tasks = "niah_multikey_1@manpages,niah_multiquery@manpages,niah_multikey_1@nodejs-docs,niah_multiquery@nodejs-docs"
    printed = set(run("scripts/paired_runs.py", *stores, "--tasks", tasks, "--pairs", *pairs).splitlines())
    assert pairs and len(lines) > 20
    assert [line for line in lines if line not in printed] == []


def test_kept_positions_shares_sum_to_the_budget() -> None:
    """On the default model at 512 tokens: under ``flat`` every head keeps p of the body, so a method's shares of
    the ten equal spans average p; the needles' shares sum to 1."""
    out = run("benchmarks/kept_positions.py", "--model", "models/hybrid-byte-12l", "--methods",
              "gatesight/flat,keydiff/flat", "--keep-fractions", "0.25", "--task", "niah_single_2", "--n", "1",
              "--length", "512")
    rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ") for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| method")}
    for method in ("gatesight/flat", "keydiff/flat"):
        shares = [float(cell) for cell in rows[method][2:]]
        assert len(shares) == 10 and sum(shares) / 10 == pytest.approx(0.25, abs=0.01)
    assert sum(float(cell) for cell in rows["needles (share of needle tokens)"][2:]) == pytest.approx(1, abs=0.02)


def test_kvpress_side_by_side_holds_parity_at_tiny_size(tmp_path: Path) -> None:
    """kvpress's own pipeline against the protocol on a 2-layer random model: every answer equal, parity holds."""
    out = tmp_path / "side.md"
    run("benchmarks/kvpress_side_by_side.py", "--context", "256", "--questions", "1", "--answer-tokens", "2",
        "--keep", "0.5", "--layers", "2", "--out", str(out))
    page = out.read_text(encoding="utf-8")
    assert "Greedy answers equal in 3 of 3" in page
    parity = [line for line in page.splitlines() if line.startswith("| ") and line.endswith(" |")
              and line.split(" | ")[0][2:] in ("snapkv", "knorm", "keydiff") and "/ 128" in line]
    assert len(parity) == 3 and all(line.endswith("| holds |") for line in parity)


def test_real_geometry_at_tiny_size(tmp_path: Path) -> None:
    """Four layers of the 0.8B-like geometry at 256 tokens: GateSight's evidence is (β, g, ‖v‖) in float32 for the
    16 value heads of each of the 3 GDN layers (576 bytes a token)."""
    out = tmp_path / "geometry.md"
    run("benchmarks/real_geometry.py", "--layers", "4", "--lengths", "256", "--out", str(out))
    row = next(line for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("| 256 |"))
    cells = row.strip("| ").split(" | ")
    assert int(cells[3]) == 3 * 16 * 3 * 4


@pytest.fixture
def smollm2() -> None:
    """Skips where SmolLM2 is not converted (the scripts load it by name)."""
    if pretrained.installed(pretrained.CHECKPOINTS["smollm2-135m-instruct"]) is None:
        pytest.skip("smollm2-135m-instruct is not fetched: run `bench fetch-model smollm2-135m-instruct` once")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row of ``text`` but the header rules."""
    return [line.strip("| ").split(" | ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]


@pytest.mark.study
@pytest.mark.realmodel
def test_kvzip_parity_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """64 body tokens, p = 0.5: the positions kvpress's KVzipPress keeps, in all 90 heads."""
    out = tmp_path / "kvzip.md"
    run("benchmarks/kvzip_parity.py", "--tokens", "64", "--fractions", "0.5", "--out", str(out))
    row = next(cells for cells in table_rows(out.read_text(encoding="utf-8")) if cells[0] == "0.5")
    kept_ours, kept_kvpress = row[1].split(" / ")
    assert kept_ours == kept_kvpress and row[2] == "90 of 90" and row[3] == "0" and row[4] == "yes"


@pytest.mark.study
@pytest.mark.realmodel
def test_chat_answers_begin_as_the_committed_ones(smollm2, tmp_path: Path) -> None:
    """Greedy answers of 4 tokens are the first words of the committed 40-token answers of the teacher."""
    out = tmp_path / "chat.md"
    run("benchmarks/chat_answers.py", "--models", "smollm2-135m-instruct", "--tokens", "4", "--out", str(out))
    short = {cells[0]: cells[1] for cells in table_rows(out.read_text(encoding="utf-8"))[1:]}
    committed = {cells[0]: cells[1] for cells in
                 table_rows((DOCS / "hybrid" / "phase5" / "chat-committed.md").read_text(encoding="utf-8"))[1:]}
    assert len(short) == 10 and short.keys() == committed.keys()
    assert all(committed[question].startswith(answer.rstrip(".")) for question, answer in short.items())


@pytest.mark.study
@pytest.mark.realmodel
def test_long_context_perplexity_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """One window of 128 tokens: each perplexity is the exponential of its mean loss."""
    out = tmp_path / "ppl.json"
    run("benchmarks/long_context_ppl.py", "--models", "smollm2-135m-instruct", "--sources", "manpages",
        "--windows", "1", "--context", "128", "--target", "16", "--out", str(out))
    result = json.loads(out.read_text(encoding="utf-8"))
    [[window_loss, last_loss]] = result["losses"]["smollm2-135m-instruct"]["manpages"]
    summary = result["summary"]["manpages / smollm2-135m-instruct"]
    assert summary["window_ppl"] == pytest.approx(math.exp(window_loss))
    assert summary["last_ppl"] == pytest.approx(math.exp(last_loss))


@pytest.mark.study
@pytest.mark.realmodel
def test_qk_norms_erase_the_teachers_retrieval_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """The page's finding on one item per task at 512 tokens: the teacher answers both questions, and with its q
    and k normalised as the old conversion normalised them, neither."""
    out = tmp_path / "qk.json"
    run("benchmarks/qk_norm_regime.py", "--n", "1", "--length", "512", "--out", str(out))
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["questions"] == 2
    assert result["as it is"]["scores"] == [1.0, 1.0]
    assert result["q/k normalised in the 8 kept layers"]["scores"] == [0.0, 0.0]


@pytest.mark.study
@pytest.mark.realmodel
def test_prefill_real_at_tiny_size(smollm2) -> None:
    """128 tokens, one repeat: each ratio printed is its prefill's time over transformers' forward."""
    row = next(cells for cells in table_rows(run("benchmarks/prefill_real.py", "--lengths", "128", "--repeats", "1"))
               if cells[0] == "128")
    reference = float(row[1])
    for cell in row[2:4]:
        seconds, ratio = re.fullmatch(r"([\d.]+) \(([\d.]+)\)", cell).groups()
        assert float(ratio) == pytest.approx(float(seconds) / reference, abs=0.006)


@pytest.mark.study
@pytest.mark.realmodel
def test_teacher_layer_split_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """One question at 512 tokens: the top split keeps the 7 layers of highest head retrieval score, and the
    teacher with every layer whole answers it."""
    out = tmp_path / "split.json"
    run("benchmarks/teacher_layer_split.py", "--n", "1", "--select", "1", "--length", "512", "--tasks",
        "niah_single_2", "--no-baselines", "--out", str(out))
    result = json.loads(out.read_text(encoding="utf-8"))
    scores = result["head_score_max_per_layer"]
    top = sorted(sorted(range(len(scores)), key=lambda layer: -scores[layer])[:7])
    assert result["splits"]["top 7 by head retrieval score"]["layers"] == top
    assert result["splits"]["all layers"]["layers"] == list(range(30))
    assert result["splits"]["all layers"]["scores"] == [1.0]


@pytest.mark.study
@pytest.mark.realmodel
def test_kvzip_cost_compares_two_trees_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """This checkout against itself at 128 tokens: KVzip's scores equal bit for bit, no kept entry differs."""
    out = tmp_path / "cost.jsonl"
    run("benchmarks/kvzip_cost.py", "--tree", "a=.", "--tree", "b=.", "--models", "smollm2-135m-instruct",
        "--lengths", "128", "--repeats", "1", "--out", str(out))
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert summary["scores_equal"] is True and summary["kept_entries_differing"] == 0 and summary["kept_entries"] > 0


@pytest.mark.study
@pytest.mark.realmodel
def test_context_speed_compares_two_trees_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """This checkout against itself, one context of 512 tokens: the same rows bit for bit, in every round."""
    out = tmp_path / "speed.jsonl"
    run("benchmarks/context_speed.py", "--tree", "a=.", "--tree", "b=.", "--rounds", "1", "--length", "512",
        "--methods", "snapkv/flat", "--keep-fractions", "0.5", "--out", str(out))
    summary = json.loads(out.read_text(encoding="utf-8"))
    assert summary["rows_bit_equal"] is True and summary["rows_same_answers"] is True
    assert summary["a"]["same_rows_every_round"] and summary["a"]["prefill_s"] < summary["a"]["context_s"]


@pytest.mark.study
@pytest.mark.realmodel
def test_kvpress_parity_real_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """160 tokens at p = 0.5 and one RULER context a task: every press keeps kvpress's count, kvpress's positions in
    every head or only exact ties apart, the first logit on kvpress's positions within float noise; both pipelines
    give the same answers."""
    out = tmp_path / "parity.md"
    run("benchmarks/kvpress_parity_real.py", "--tokens", "160", "--fractions", "0.5", "--length", "512", "--n", "1",
        "--compression-ratios", "0.5", "--max-new-tokens", "2", "--out", str(out))
    positions, pipelines = out.read_text(encoding="utf-8").split("## Answers through both pipelines")
    kept = table_rows(positions)[1:]
    assert len(kept) == 5
    for press, _, counts, heads, differences, _, on_theirs in kept:
        ours, theirs = counts.split(" / ")
        assert ours == theirs == "80", press
        assert heads == "90 of 90" or differences.startswith("exact ties"), press
        assert float(on_theirs) < 1e-3, press
    answers = table_rows(pipelines)[1:]
    assert len(answers) == 4 and all(len(set(cells[2].split(" / "))) == 1 for cells in answers)


@pytest.mark.study
@pytest.mark.realmodel
def test_kvpress_side_by_side_real_at_tiny_size(smollm2, tmp_path: Path) -> None:
    """One press, one context a task of 512 tokens: kvpress's pipeline and this protocol answer alike."""
    out = tmp_path / "side.md"
    run("benchmarks/kvpress_side_by_side_real.py", "--presses", "knorm", "--length", "512", "--n", "1",
        "--compression-ratios", "0.5", "--max-new-tokens", "2", "--out", str(out))
    [row] = [cells for cells in table_rows(out.read_text(encoding="utf-8")) if cells[0] == "KnormPress"]
    equal, asked = row[2].split(" / ")
    assert equal == asked and int(asked) > 0


def test_oracle_allocation_runs_through_bench_compare_at_tiny_size(model_dir, tmp_path: Path) -> None:
    """The study's press under ``global`` on the tiny model: its rows are written as bench compare writes them, and
    each child keeps the allocator's exact budget (tests/presses/test_oracle_allocation.py checks the counts)."""
    run("benchmarks/oracle_allocation.py", "--model", str(model_dir), "--methods", "gatesight_oracle/global",
        "--keep-fractions", "0.3", "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out",
        str(tmp_path / "out"))
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    children = [row for row in rows if row["press"] == "gatesight_oracle"]
    assert children and all(row["kept_entries"] == row["body_entries"] // (row["n_context"] - row["protected"])
                            * round(0.3 * (row["n_context"] - row["protected"])) for row in children)
