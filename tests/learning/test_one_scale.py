"""`bench train --scale one`: an estimator whose scores share one scale across attention layers and KV heads, so
that GateSight runs with the global allocator exactly when its estimator is of that kind."""

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import presses
from allocators.integerize import round_half_up
from bench.commands.cli import main
from bench.run.plan import plan
from gatesight_learning.estimator import LOG_FLOOR, TrainSettings, one_scale_targets
from presses.gatesight import GateSightEstimator, GateSightPress, build_features
from pretrained import loading
from runtime import prefill
from runtime.errors import UsageError
from tests.helpers import compare_settings, copy_model, run_cli, token_ids

LABEL = ["--limit", "4", "--tokens", "40", "--continuations", "1", "--max-new-tokens", "4"]
REMEDY = "bench train --scale one"


@pytest.fixture(scope="module")
def trained(model_dir, tmp_path_factory):
    """Label four tiny windows (four corpora), then train on them with the option omitted, ``--scale head`` and
    ``--scale one``: ``{"labels": DIR, "omitted" | "head" | "one": the estimator's DIR}``."""
    root = tmp_path_factory.mktemp("one-scale")
    model = ["--model", str(model_dir)]
    assert main(["label", *model, "--out", str(root / "labels"), *LABEL]) == 0
    out = {"labels": root / "labels"}
    for name, flags in {"omitted": [], "head": ["--scale", "head"], "one": ["--scale", "one"]}.items():
        out[name] = root / name
        assert main(["train", *model, "--labels", str(root / "labels"), "--out", str(out[name]), "--epochs", "2",
                     *flags]) == 0
    return out


def test_one_scale_targets_keep_the_raw_ratios_across_layers_and_heads():
    """Two targets above the floor differ by the log of their utilities' ratio, whatever layers and heads they are
    of; the document's largest utility is 0, and every utility below the floor's share is log(floor)."""
    generator = torch.Generator().manual_seed(0)
    # the layers' utilities differ by orders of magnitude, as a max-normalisation per row would hide
    utilities = {3: torch.rand(2, 50, generator=generator) * 40, 7: torch.rand(2, 50, generator=generator) * 0.3}
    utilities[7][1, 5] = 0.0
    targets = one_scale_targets(utilities)
    largest = max(float(u.max()) for u in utilities.values())
    flat_u = torch.cat([u.flatten() for u in utilities.values()]).double()
    flat_t = torch.cat([t.flatten() for t in targets.values()]).double()
    above = flat_u / largest > LOG_FLOOR
    assert above.sum() == flat_u.numel() - 1
    ratios = flat_u[above][:, None] / flat_u[above][None]  # every pair, across layers and heads
    assert torch.allclose((flat_t[above][:, None] - flat_t[above][None]).exp(), ratios, rtol=1e-5)
    assert float(flat_t.max()) == 0.0 and float(targets[7][1, 5]) == pytest.approx(torch.tensor(LOG_FLOOR).log())
    # one constant per document: scaling the document's utilities leaves its targets as they are
    assert all(torch.allclose(targets[k], t) for k, t in one_scale_targets({k: 5 * u for k, u in
                                                                             utilities.items()}).items())


def test_head_is_the_default_and_unchanged(trained):
    """The option omitted trains the paper's estimator: the same tensors, bit for bit, as ``--scale head``."""
    omitted, head = (GateSightEstimator.load(trained[name]) for name in ("omitted", "head"))
    assert omitted.layers.keys() == head.layers.keys()
    assert all(torch.equal(omitted.layers[layer][key], head.layers[layer][key])
               for layer in head.layers for key in head.layers[layer])
    assert omitted.scale == head.scale == omitted.meta["scale"] == "head"
    assert omitted.meta["settings"] == head.meta["settings"]


def test_the_evaluation_names_the_estimators_scale(trained):
    """evaluation.md heads its table with the scale of the estimator beside it: the per-head table of a ``one``
    estimator would otherwise read as a ``head`` one's (and it does not measure ranking across layers)."""
    for name, scale in (("omitted", "head"), ("head", "head"), ("one", "one")):
        first = (trained[name] / "evaluation.md").read_text().splitlines()[0]
        assert first == f"# GateSight estimator on scale `{scale}`: leave-one-corpus-out evaluation", first
    assert "not measured here" in (trained["one"] / "evaluation.md").read_text()
    assert "not measured here" not in (trained["head"] / "evaluation.md").read_text()


def test_the_scale_round_trips_in_the_meta(trained, tmp_path):
    one = GateSightEstimator.load(trained["one"])
    assert one.scale == one.meta["scale"] == one.meta["settings"]["scale"] == "one"
    one.save(tmp_path / "again")
    assert GateSightEstimator.load(tmp_path / "again").scale == "one"
    with pytest.raises(UsageError, match="scale='both': choose head or one"):
        TrainSettings(scale="both")


def test_global_refuses_a_head_estimator_and_takes_a_one_scale_one(trained, model_dir, tmp_path, no_model_load):
    """The check sees the estimator the run reads, before the model loads: the model's own (bound from its
    directory) as well as one given by ``gatesight[estimator=DIR]``."""
    def planned(model, press):
        return plan(compare_settings(model, tmp_path / "out", presses=[press], allocators=["global"]))

    for model, press in ((model_dir, "gatesight"), (model_dir, f"gatesight[estimator={trained['head']}]")):
        with pytest.raises(UsageError) as refused:
            planned(model, press)
        assert "gatesight scores each layer on a scale of its own" in str(refused.value)
        assert "trained on scale 'head'" in str(refused.value) and REMEDY in str(refused.value)
    assert planned(model_dir, f"gatesight[estimator={trained['one']}]").methods[0].allocator.name == "global"
    own = copy_model(model_dir, tmp_path)  # the model's own estimator on one scale
    shutil.rmtree(own / "gatesight")
    shutil.copytree(trained["one"], own / "gatesight")
    assert [m.label for m in planned(own, "gatesight").methods] == ["gatesight/global"]


def test_the_cli_refusal_says_how_to_get_a_one_scale_estimator(model_dir, tmp_path, capsys, no_model_load):
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "gatesight", "--alloc", "global",
                        "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and REMEDY in err, err
    assert not (tmp_path / "out").exists()


def test_a_one_scale_estimator_keeps_the_global_top_b_of_its_predictions(trained, model_dir):
    """Under global, the kept (layer, KV head, entry) set is the top-B of the estimator's raw predictions (its log
    utilities) over every layer and head together, B exactly the budget; the head estimator is refused alike by
    the library path."""
    model, _, _ = loading.load(model_dir)
    one = GateSightEstimator.load(trained["one"])
    press = GateSightPress(estimator=one)
    assert press.comparable_scale
    parent = prefill(model, token_ids(90, 3, vocab=256), protected=4, evidence=press.evidence(None))
    kept = presses.Selection(parent, press).plan("global", 0.3)
    body = torch.arange(parent.protected, parent.n)
    signals = parent.evidence.recurrent_signals
    predictions = {layer: one.logits(layer, build_features(signals, one.gdn_layers[layer], parent.n, body))
                   for layer in parent.adapter.attention_layers}
    cells = [(layer, h, int(body[i])) for layer, p in predictions.items() for h in range(p.shape[0])
             for i in range(p.shape[1])]
    flat = torch.cat([p.flatten() for p in predictions.values()])
    budget = len(predictions) * parent.adapter.geometry.num_kv_heads * round_half_up(0.3 * len(body))
    top = {cells[i] for i in flat.topk(budget).indices.tolist()}
    chosen = {(layer, h, int(position)) for layer, heads in kept.layers.items() for h, positions in enumerate(heads)
              for position in positions}
    assert len(chosen) == budget and chosen == top
    per_layer = {layer: sum(len(p) for p in heads) for layer, heads in kept.layers.items()}
    assert len(set(per_layer.values())) > 1  # the budget moved between layers: not a flat split in disguise
    head = GateSightPress(estimator=GateSightEstimator.load(trained["head"]))
    with pytest.raises(UsageError, match=REMEDY):
        presses.compress(parent, head, "global", keep_fraction=0.3)
    assert presses.compress(parent, head, "flat", keep_fraction=0.3).kv  # the scale matters to global only


def test_shards_without_scales_are_refused_for_one_scale(trained, model_dir, tmp_path, capsys, monkeypatch):
    """A shard labelled before shards recorded their scales has no raw utilities: ``--scale one`` names it and the
    fix before the model loads, and writes nothing."""
    old = tmp_path / "old"
    shutil.copytree(trained["labels"], old)
    path = sorted(old.glob("*.safetensors"))[1]
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("scale.")}
        meta = f.metadata()
    save_file(tensors, str(path), metadata=meta)
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    code, err = run_cli(capsys, "train", "--model", model_dir, "--labels", old, "--out", tmp_path / "est",
                        "--scale", "one")
    assert code == 2 and f"{path} records no scales" in err and "label again" in err and "--scale head" in err, err
    assert not (tmp_path / "est").exists()
