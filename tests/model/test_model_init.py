"""The default model's GDN decay initialisation (Mamba2 / Gated DeltaNet ranges) and its no-decay group."""

import math

import torch

from hybridmodel.train import GDN_A_RANGE, GDN_DT_RANGE, new_model, parameter_groups


def test_fresh_model_has_the_documented_decay_ranges():
    model = new_model(260, seed=0)
    modules = [layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn")]
    assert len(modules) == 9
    for module in modules:
        dt = torch.nn.functional.softplus(module.dt_bias.detach().double())  # dt_bias is the inverse softplus of dt
        a = module.A_log.detach().double().exp()
        assert bool(((dt >= GDN_DT_RANGE[0] * (1 - 1e-6)) & (dt <= GDN_DT_RANGE[1] * (1 + 1e-6))).all()), dt
        assert bool(((a >= GDN_A_RANGE[0]) & (a <= GDN_A_RANGE[1])).all()), a
    lives = [math.log(2) / (float(m.A_log.exp()[h]) * float(torch.nn.functional.softplus(m.dt_bias)[h]))
             for m in modules for h in range(m.dt_bias.numel())]
    lives.sort()
    assert lives[len(lives) // 2] >= 5 and lives[-1] >= 64  # memory over many tokens, some heads slow
    # transformers' own initialisation would fail the same checks: dt_bias = 1 gives dt = softplus(1) = 1.31
    assert not torch.allclose(modules[0].dt_bias, torch.ones_like(modules[0].dt_bias))


def test_decay_parameters_sit_in_the_no_decay_group():
    model = new_model(260, seed=0)
    decay, keep = parameter_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and keep["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    kept = {names[id(p)] for p in keep["params"]}
    decayed = {names[id(p)] for p in decay["params"]}
    assert all(n in kept for n in names.values() if n.endswith(("A_log", "dt_bias", "norm.weight")))
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in decayed and not kept & decayed
    assert len(kept) + len(decayed) == len(names)
