"""Qwen3.5-MoE: checkpoints laid out as the hub's (``Qwen3_5MoeForConditionalGeneration``, vision tower included)
load as the text model with the wrapper's own logits (as dense Qwen3.5's do), and ``bench compare`` runs on them.

The runtime invariants (keep-all fork = fresh run, compacted = masked full attention, chunked prefill = one pass,
bfloat16, batched children = one at a time, GDN continuation) and every press × allocator run on the tiny text model
through the family parametrisations of test_fork, test_chunked_and_bf16, test_batch, test_gdn_continuation,
test_presses and test_kvpress_bridge; the first test here shows that those runs route tokens for real.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

from allocators.integerize import round_half_up
from bench.commands.cli import main
from bench.store.result_store import ResultStore
from presses.gatesight import GateSightEstimator
from pretrained.loading import ModelSpec, load
from runtime import adapter_for, prefill
from runtime.adapters.qwen3_5 import Qwen3_5Adapter
from runtime.adapters.qwen3_5_moe import Qwen3_5MoeAdapter
from runtime.adapters.tiny import QWEN3_5_ROPE
from tests.helpers import save_model, token_ids

VOCAB = 260  # the byte tokenizer's


def test_the_tiny_model_routes_tokens_to_every_expert(tiny):
    """Every MoE block sends some tokens of one context to each expert, so the family's invariant runs cover
    a router whose choice differs token by token."""
    model = tiny("qwen3_5_moe")
    chosen = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda module, args, out, i=i: chosen.__setitem__(i, out[2]))
             for i, layer in enumerate(model.model.layers)]
    try:
        model(token_ids(120, 0)[None])
    finally:
        for hook in hooks:
            hook.remove()
    for layer, indices in chosen.items():  # [tokens, top_k] expert indices
        assert (torch.bincount(indices.flatten(), minlength=2) > 0).all(), layer


# family -> (multimodal wrapper, its config, the text model transformers loads from it, that model's adapter)
WRAPPERS = {
    "qwen3_5": (Qwen3_5ForConditionalGeneration, Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5Adapter),
    "qwen3_5_moe": (Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeAdapter),
}


def _multimodal(family: str):
    """A tiny random Qwen3.5 or Qwen3.5-MoE with its vision tower, on the byte tokenizer's vocabulary."""
    torch.manual_seed(0)
    wrapper, config, _, _ = WRAPPERS[family]
    text = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        full_attention_interval=2, eos_token_id=257, rope_parameters=QWEN3_5_ROPE,
    )
    text.update(dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16)
                if family == "qwen3_5_moe" else dict(intermediate_size=64))
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=16)
    model = wrapper(config(text_config=text, vision_config=vision)).eval()
    with torch.no_grad():  # random init leaves the RMSNorm offsets at zero and the router at zero: perturb all
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _per_expert(path) -> None:
    """Rewrite a saved checkpoint with one gate/up/down tensor per expert (the layout MoE checkpoints had before
    transformers fused the experts into 3-D tensors; its loader fuses them back)."""
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith("mlp.experts.gate_up_proj")]:
        prefix = name.removesuffix("gate_up_proj")
        gate_up, down = tensors.pop(name), tensors.pop(prefix + "down_proj")  # [E, 2I, D], [E, D, I]
        for e in range(gate_up.shape[0]):
            gate, up = gate_up[e].chunk(2, dim=0)
            tensors.update({f"{prefix}{e}.gate_proj.weight": gate.contiguous(),
                            f"{prefix}{e}.up_proj.weight": up.contiguous(),
                            f"{prefix}{e}.down_proj.weight": down[e].contiguous()})
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("family, layout", [("qwen3_5", "fused"), ("qwen3_5_moe", "fused"),
                                            ("qwen3_5_moe", "per_expert")])
def test_conditional_generation_loads_as_the_text_model(tmp_path, family, layout):
    multimodal = _multimodal(family)
    directory = save_model(multimodal, tmp_path)
    if layout == "per_expert":
        _per_expert(directory / "model.safetensors")
    model, _, _ = load(ModelSpec(str(directory)))
    _, _, text_class, adapter_class = WRAPPERS[family]
    assert type(model) is text_class and type(adapter_for(model)) is adapter_class
    wrapper = multimodal.state_dict()
    loaded = model.state_dict()
    # every text weight arrives under the text model's names; the vision tower is left behind
    assert set(loaded) == {name.replace("model.language_model.", "model.") for name in wrapper
                           if not name.startswith("model.visual.")}
    for name, tensor in wrapper.items():
        if not name.startswith("model.visual."):
            assert torch.equal(loaded[name.replace("model.language_model.", "model.")], tensor), name
    context = token_ids(80, 1, VOCAB)
    expected = multimodal(context[None]).logits[0, -1]  # text-only positions: the multimodal RoPE's three axes agree
    assert torch.allclose(prefill(model, context, protected=4).last_logits, expected, atol=1e-5, rtol=0)


def test_the_multimodal_wrapper_itself_is_refused_with_the_way_to_load_it():
    with pytest.raises(ValueError, match="Qwen3_5MoeForConditionalGeneration is not a causal-LM wrapper .* load it "
                                         "with AutoModelForCausalLM"):
        adapter_for(_multimodal("qwen3_5_moe"))


def test_bench_compare_runs_on_a_conditional_generation_checkpoint(tmp_path):
    directory = save_model(_multimodal("qwen3_5_moe"), tmp_path / "model")
    text_model, _, _ = load(ModelSpec(str(directory)))
    GateSightEstimator.random(adapter_for(text_model)).save(directory / "gatesight")
    out = tmp_path / "out"
    assert main(["compare", "--model", str(directory), "--press", "keydiff,gatesight", "--alloc", "flat",
                 "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out",
                 str(out)]) == 0
    rows = ResultStore(out, readonly=True).rows
    assert {row["press"] for row in rows} == {"none", "keydiff", "gatesight"}
    for row in rows:
        if row["press"] != "none":  # both attention layers × both KV heads keep half the body
            assert row["keep_fraction"] == 0.5
            assert row["kept_entries"] == 2 * 2 * round_half_up(0.5 * (row["n_context"] - row["protected"]))
