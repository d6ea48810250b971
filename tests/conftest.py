"""The fixtures every test folder shares: the tiny models by family (``tiny``), a saved tiny byte-level model
directory (``model_dir``) and a guard that no model loads (``no_model_load``); what they are built from:
``helpers.py``."""

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from allocators import HeadShares
from presses.calibration import calibrate, weights_fingerprint
from presses.gatesight import GateSightEstimator
from pretrained import loading
from runtime import adapter_for
from testing.tiny_models import MODELS

from .helpers import REAL_MODEL, VARIANTS, save_model


@pytest.fixture(scope="session")
def tiny():
    """Cached models by family name: a tiny random model of the family (or of a configuration of
    :data:`~tests.helpers.VARIANTS`), or for :data:`REAL_MODEL` the pretrained model itself (skipped, with the
    command that fetches it, where it is not converted yet)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            if name == REAL_MODEL:
                import pretrained
                from pretrained.loading import load

                if pretrained.installed(pretrained.CHECKPOINTS[name]) is None:
                    pytest.skip(f"{name} is not fetched: run `bench fetch-model {name}` once")
                cache[name] = load(name)[0]
            else:
                cache[name] = {**MODELS, **VARIANTS}[name]()
        return cache[name]

    return get


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random byte-level Qwen3.5 saved like the shipped model, with calibration, head shares and a GateSight
    artifact."""
    directory = tmp_path_factory.mktemp("tiny-byte-model")
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, full_attention_interval=2, tie_word_embeddings=True, eos_token_id=257,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    )
    model = Qwen3_5ForCausalLM(config).eval()
    save_model(model, directory)
    adapter = adapter_for(model)
    GateSightEstimator.random(adapter).save(directory / "gatesight")
    calibrate(model, [torch.randint(0, 256, (128,))], ["random bytes"]).save(directory)
    # unequal shares that change with p, so that head_shares differs from flat wherever it runs
    low = {layer: [1.0 + i, 2.0 + i] for i, layer in enumerate(adapter.attention_layers)}
    high = {layer: [3.0 + i, 1.0] for i, layer in enumerate(adapter.attention_layers)}
    HeadShares({0.1: low, 0.5: high}, {"from": "a test fixture"}, weights_fingerprint(directory)).save(directory)
    return directory


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model fails the test: the error must come before."""
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model was loaded before the bad input was "
                                                                     "reported"))
