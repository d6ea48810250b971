"""`bench label` -> `bench train` -> `bench analyze` end to end on a tiny byte-level model."""

import shutil

import pytest
import torch

from bench.commands.cli import main
from gatesight_learning.evaluate import overlap_and_coverage, spearman, split_by_corpus
from gatesight_learning.shards import load_shard
from presses.gatesight import GateSightEstimator
from pretrained import loading


def test_label_train_analyze(model_dir, tmp_path, capsys):
    labels = tmp_path / "labels"
    args = ["--model", str(model_dir)]
    assert main(["label", *args, "--out", str(labels), "--limit", "6", "--tokens", "48", "--continuations", "2",
                 "--max-new-tokens", "6"]) == 0
    shards = [load_shard(p) for p in sorted(labels.glob("*.safetensors"))]
    # round-robin over the labelling sources: six windows come from six sources
    assert len(shards) == 6 and len({s["corpus"] for s in shards}) == 6
    for path, shard in zip(sorted(labels.glob("*.safetensors")), shards):
        n = next(iter(shard["signals"].values())).shape[0]
        for futures in ("labels", "reconstruction", "both"):
            labelled = load_shard(path, futures)["labels"]
            assert all(v.shape[1] == n and torch.allclose(v.amax(-1), torch.ones(v.shape[0]))
                       for v in labelled.values())
        both, sampled, rebuilt = (load_shard(path, f)["labels"] for f in ("both", "labels", "reconstruction"))
        assert all(torch.equal(both[k], torch.maximum(sampled[k], rebuilt[k])) for k in both)
        # raw utilities: each future's labels times its normaliser (the maximum of its row), both futures' maximum
        raw = {f: load_shard(path, f)["utilities"] for f in ("both", "labels", "reconstruction")}
        for k, u in raw["labels"].items():
            assert torch.allclose(u / u.amax(-1, keepdim=True), sampled[k], atol=1e-6)
            assert torch.equal(raw["both"][k], torch.maximum(u, raw["reconstruction"][k]))
        assert shard["seconds"] > 0
    artifact = tmp_path / "artifact"
    assert main(["train", *args, "--labels", str(labels), "--out", str(artifact), "--epochs", "1",
                 "--futures", "both"]) == 0
    out = capsys.readouterr().out
    assert "| MLP (GateSight) |" in out and "| ridge |" in out and "| age (older first) |" in out
    estimator = GateSightEstimator.load(artifact)
    assert sorted(estimator.meta["corpora"]) == sorted({s["corpus"] for s in shards})
    assert estimator.meta["futures"] == "both" and estimator.meta["label_seconds_per_window"] > 0
    assert estimator.meta["weights"] == loading.fingerprint(model_dir, "weights")  # what it describes
    # observation 3 reads the per-layer evaluation: its layer means are the overall leave-one-corpus-out figures
    from gatesight_learning.analyze import observation_3

    obs3 = observation_3(estimator.meta)
    for name, by_layer in estimator.meta["loco_per_layer"].items():
        for key in ("rho", "ov@10", "cov@10"):
            layer_mean = sum(m[key] for m in by_layer.values()) / len(by_layer)
            assert abs(layer_mean - estimator.meta["loco"][name][key]) < 1e-9
    assert obs3["layers"] == 2 and all(0 <= v <= 2 for v in obs3["layers ahead"].values())
    assert main(["analyze", *args, "--labels", str(labels), "--out", str(tmp_path / "analysis")]) == 0
    assert (tmp_path / "analysis" / "half_life_histogram.png").exists()
    assert (tmp_path / "analysis" / "half_lives.png").exists()
    assert "static vs measured spearman" in (tmp_path / "analysis" / "observations.md").read_text()
    # rebuilt on each run: what it wrote itself is written over, a file edited or replaced by hand is moved aside
    analysis = tmp_path / "analysis"
    assert main(["analyze", *args, "--labels", str(labels), "--out", str(analysis)]) == 0
    assert not list(analysis.glob("*.backup-*"))
    notes = (analysis / "observations.md").read_text() + "MY NOTES\n"
    (analysis / "observations.md").write_text(notes)
    (analysis / "half_lives.png").write_bytes(b"my figure")
    assert main(["analyze", *args, "--labels", str(labels), "--out", str(analysis)]) == 0
    [kept_notes] = analysis.glob("observations.md.backup-*")
    [kept_figure] = analysis.glob("half_lives.png.backup-*")
    assert kept_notes.read_text() == notes and kept_figure.read_bytes() == b"my figure"
    assert "MY NOTES" not in (analysis / "observations.md").read_text()
    assert (analysis / "half_lives.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in analysis.glob("*.backup-*")) == sorted([kept_notes.name, kept_figure.name])

    # labels of a retrained model must not mix with these: refused before any work, nothing overwritten
    retrained = tmp_path / "retrained"
    shutil.copytree(model_dir, retrained)
    weights = retrained / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    before = {p.name: p.read_bytes() for p in labels.glob("*.safetensors")}
    assert main(["label", "--model", str(retrained), "--out", str(labels), "--limit", "6", "--tokens", "48"]) == 2
    assert "was labelled with other model weights" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in labels.glob("*.safetensors")} == before


def test_split_by_corpus_never_leaks():
    shards = [{"corpus": c, "document": str(i)} for i, c in enumerate("aabbbc")]
    train, test = split_by_corpus(shards, "b")
    assert {s["corpus"] for s in test} == {"b"} and len(test) == 3
    assert "b" not in {s["corpus"] for s in train} and len(train) == 3


def test_ranking_metrics_on_hand_made_cases():
    truth = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    assert spearman(truth, truth * 3 + 1) == 1.0
    assert spearman(truth, -truth) == -1.0
    assert overlap_and_coverage(truth, truth, 0.2) == (1.0, 1.0)
    pred = torch.tensor([9.0, 8, 7, 6, 5, 4, 3, 2, 1, 0])  # reversed: top-2 predicted are the two smallest
    overlap, coverage = overlap_and_coverage(pred, truth, 0.2)
    assert overlap == 0.0 and coverage == pytest.approx((0 + 1) / (9 + 8))


def test_average_ranks_and_the_single_head_oracle_against_brute_force():
    """Ties share their average rank (counted by hand); the oracle picks, per (layer, KV head), the cell whose mean
    ρ over the documents is largest in magnitude, as a loop over every cell computes it."""
    from statistics import mean

    from gatesight_learning.evaluate import average_ranks, single_head_oracle

    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    brute = torch.tensor([[float((v < a).sum() + ((v == a).sum() - 1) / 2) for a in v] for v in x])
    assert torch.equal(average_ranks(x), brute.double())
    assert average_ranks(x)[0].tolist() == [4.0, 0.5, 4.0, 2.0, 0.5, 4.0]
    generator = torch.Generator().manual_seed(0)
    shards = [{"signals": {j: torch.randint(0, 5, (30, 2, 3), generator=generator).float() for j in (0, 1, 3)},
               "labels": {2: torch.rand(2, 30, generator=generator), 4: torch.rand(2, 30, generator=generator)}}
              for _ in range(4)]
    windows = {2: [0, 1], 4: [0, 1, 3]}
    predict = single_head_oracle(shards, windows)
    for layer, gdn_layers in windows.items():
        for h in range(2):
            candidates = []
            for j, m, s in ((j, m, s) for j in gdn_layers for m in range(2) for s in range(3)):
                rho = mean(spearman(sh["signals"][j][:, m, s], sh["labels"][layer][h]) for sh in shards)
                candidates.append((abs(rho), (j, m, s, 1.0 if rho >= 0 else -1.0)))
            j, m, s, sign = max(candidates)[1]
            assert torch.equal(predict(shards[0], layer)[h], sign * shards[0]["signals"][j][:, m, s]), (layer, h)


def test_corpus_windows_have_unique_ids():
    from gatesight_learning.record import corpus_windows
    from hybridmodel.tokenizer import build_tokenizer
    from workloads.corpus import LABEL_SOURCES, label_documents

    windows = corpus_windows(build_tokenizer(), tokens=256)
    ids = [(corpus, doc) for corpus, doc, _ in windows]
    present = {source for source in LABEL_SOURCES if label_documents(source)}
    assert len(ids) == len(set(ids)) and {c for c, _ in ids} == present and len(present) >= 3


@pytest.mark.slow  # ~4 s: it labels three times; CI's slow run holds it
def test_label_parts_share_one_directory(model_dir, tmp_path):
    """Two processes labelling parts 0/2 and 1/2 write exactly the shards one process writes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gatesight_learning.record import record_corpus

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = {"limit": 4, "tokens": 32, "continuations": 1, "max_new_tokens": 3, "weights": "w"}
    whole = {p.name for p in record_corpus(model, tokenizer, tmp_path / "whole", **settings)}
    parts = {p.name for k in range(2) for p in record_corpus(model, tokenizer, tmp_path / "parts", part=(k, 2),
                                                             **settings)}
    assert whole == parts == {p.name for p in (tmp_path / "parts").glob("*.safetensors")} and len(whole) == 4
    with pytest.raises(ValueError, match="part 2/2: expected K/N"):
        record_corpus(model, tokenizer, tmp_path / "bad", part=(2, 2), **settings)


@pytest.mark.slow  # ~3 s: it labels three times; CI's slow run holds it
def test_label_the_sampled_futures_alone(model_dir, tmp_path, capsys):
    """`bench label --futures labels` (the paper's recipe) stores no reconstruction labels, records it, and its shards
    neither mix with both-future shards nor train a both-future estimator; shards from before the flag read back
    by what they hold."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from gatesight_learning.shards import shard_settings

    sampled, both = tmp_path / "sampled", tmp_path / "both"
    common = ["--model", str(model_dir), "--limit", "2", "--tokens", "40", "--continuations", "2",
              "--max-new-tokens", "4"]
    assert main(["label", *common, "--out", str(sampled), "--futures", "labels"]) == 0
    assert main(["label", *common, "--out", str(both)]) == 0
    paths = sorted(sampled.glob("*.safetensors"))
    assert len(paths) == 2
    for path, twin in zip(paths, sorted(both.glob("*.safetensors"))):
        with safe_open(str(path), "pt") as f:
            assert not [k for k in f.keys() if k.startswith("reconstruction.")]
        assert shard_settings(path)["settings"]["futures"] == "labels"
        assert shard_settings(twin)["settings"]["futures"] == "both"
        # the same seeds: the sampled labels equal those of the run that labelled both futures
        ours, theirs = load_shard(path)["labels"], load_shard(twin)["labels"]
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert main(["label", *common, "--out", str(sampled)]) == 2  # a both-future run into a sampled-only directory
    assert "other settings" in capsys.readouterr().err and len(list(sampled.glob("*.safetensors"))) == 2
    assert main(["train", "--model", str(model_dir), "--labels", str(sampled), "--out", str(tmp_path / "est"),
                 "--futures", "both"]) == 2
    assert "no reconstruction labels" in capsys.readouterr().err and not (tmp_path / "est").exists()
    # a shard written before --futures existed: its settings lack the key, its tensors tell
    with safe_open(str(paths[0]), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    meta["settings"] = json.dumps({k: v for k, v in json.loads(meta["settings"]).items() if k != "futures"})
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=meta)
    assert shard_settings(tmp_path / "old.safetensors")["settings"]["futures"] == "labels"
    assert main(["label", *common[:-2], "--out", str(tmp_path / "bad"), "--max-new-tokens", "1"]) == 2
    assert "--max-new-tokens 1: give at least 2" in capsys.readouterr().err and not (tmp_path / "bad").exists()
