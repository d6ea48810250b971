"""GateSight on Mamba2 hybrids (issue 22, stage 3): the Mamba2 analogues of GDN's (β, g, ‖v‖) recorded at
prefill, GateSight with every allocator on each tiny family (``tests/presses/test_presses.py``, in bfloat16
``tests/runtime/test_chunked_and_bf16.py``), and the labelling → estimator → analysis pipeline on a
saved tiny Bamba, observation 1 (half-lives from A and Δ, stable across documents) measured on it."""

import pytest
import torch
import torch.nn.functional as F

from bench.commands.cli import main
from bench.store.result_store import ResultStore
from gatesight_learning.analyze import observation_1
from gatesight_learning.shards import load_shard
from hybridmodel.half_lives import static_half_lives
from presses.gatesight import GateSightEstimator, feature_names, gdn_window
from runtime import EvidenceRequest, adapter_for, prefill
from runtime.adapters.tiny import VOCAB
from tests.helpers import save_bamba


def test_signals_are_the_scan_inputs(tiny):
    """Δ·‖B‖, A·Δ and ‖x‖ per token and head, recomputed here from the Bamba mixer's own modules."""
    model = tiny("bamba")
    context = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(12))
    parent = prefill(model, context, evidence=EvidenceRequest(recurrent_signals=True))
    assert sorted(parent.evidence.recurrent_signals) == [0, 2]
    layer = model.model.layers[0]
    mixer = layer.mamba
    with torch.no_grad():
        gate, xbc, dt = mixer.in_proj(layer.input_layernorm(model.model.embed_tokens(context[None]))).split(
            [mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
        xbc = mixer.act(mixer.conv1d(xbc.transpose(1, 2))[..., :40])[0].T
    width, group_width = mixer.intermediate_size, mixer.n_groups * mixer.ssm_state_size
    x, B = xbc[:, :width], xbc[:, width : width + group_width]
    step = F.softplus(dt[0] + mixer.dt_bias)  # [40, H]
    per_group = mixer.num_heads // mixer.n_groups
    b_norm = B.reshape(40, mixer.n_groups, -1).norm(dim=-1).repeat_interleave(per_group, dim=1)
    signals = parent.evidence.recurrent_signals[0]
    assert signals.shape == (40, mixer.num_heads, 3)
    assert torch.allclose(signals[..., 0], step * b_norm, atol=1e-6)
    assert torch.allclose(signals[..., 1], -mixer.A_log.exp() * step, atol=1e-6)
    assert torch.allclose(signals[..., 2], x.reshape(40, mixer.num_heads, -1).norm(dim=-1), atol=1e-5)


@pytest.mark.parametrize("family, windows", [
    ("bamba", {1: [0], 3: [0, 2]}), ("granitemoehybrid", {1: [0], 3: [0, 2]}),
    ("falcon_h1", {0: [0], 1: [0, 1]}),  # the Mamba2 mixer beside each attention reads the same input: it counts
])
def test_each_attention_layer_reads_the_mamba2_layers_up_to_it(tiny, family, windows):
    adapter = adapter_for(tiny(family))
    assert {layer: gdn_window(adapter, layer) for layer in adapter.attention_layers} == windows
    for layer, window in windows.items():
        assert len(feature_names(adapter, layer)) == len(window) * 4 * 3 + 3  # 4 heads × 3 signals, 3 age features


def test_label_train_analyze_compare_on_a_saved_bamba(tmp_path):
    """bench label → bench train → bench analyze → bench compare --press gatesight on a tiny Bamba checkpoint; the
    analysis's observation 1 measured from the recorded A·Δ against the half-lives of A and dt_bias alone."""
    directory = tmp_path / "model"
    model = save_bamba(directory)
    args = ["--model", str(directory)]
    labels = tmp_path / "labels"
    assert main(["label", *args, "--out", str(labels), "--limit", "6", "--tokens", "48", "--continuations", "2",
                 "--max-new-tokens", "6"]) == 0
    shards = [load_shard(p) for p in sorted(labels.glob("*.safetensors"))]
    assert len(shards) == 6 and all(sorted(s["signals"]) == [0, 2] for s in shards)
    assert main(["train", *args, "--labels", str(labels), "--out", str(directory / "gatesight"), "--epochs", "1"]) == 0
    estimator = GateSightEstimator.load(directory / "gatesight")
    assert estimator.gdn_layers == {1: [0], 3: [0, 2]}

    obs1 = observation_1(shards, model, threshold=64.0)
    static = static_half_lives(model)
    assert sorted(static) == sorted(obs1["medians"]) == [(layer, head) for layer in (0, 2) for head in range(4)]
    # the per-head decay is set by A and dt_bias, the input moves Δ only a little: the measured half-lives rank as
    # the static ones do, and alike on every pair of documents
    assert obs1["static vs measured spearman"] > 0.9 and obs1["pair spearman (min)"] > 0.9
    assert main(["analyze", *args, "--labels", str(labels), "--out", str(tmp_path / "analysis")]) == 0

    out = tmp_path / "out"
    assert main(["compare", *args, "--press", "gatesight", "--alloc", "flat", "--keep-fractions", "0.5", "--tasks",
                 "niah_single_1", "--n", "1", "--length", "300", "--out", str(out)]) == 0
    assert {row["press"] for row in ResultStore(out, readonly=True).rows} == {"none", "gatesight"}
