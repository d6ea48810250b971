"""A model family is stated in one place, its adapter: the model types it serves, its layer kinds read from the config
alone, its tiny test models. What the adapter reads from a config is what transformers builds from it, for every
family, and every family has a tiny model that the family-parametrised tests run."""

import pytest

from runtime import adapter_for
from runtime.adapters import ADAPTERS, MODEL_TYPES
from testing.tiny_models import MODELS, TINY_CONFIGS
from tests.helpers import FAMILIES

#: the runtime's mixer -> the module transformers' decoder layer holds for it
MIXER_MODULES = {"attention": "self_attn", "gdn": "linear_attn", "mamba2": "mamba"}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_layer_kinds_read_from_the_config_are_the_layers_transformers_builds(tiny, family):
    model = tiny(family)
    declared_by = TINY_CONFIGS[family][0]
    adapter = adapter_for(model)
    assert type(adapter) is declared_by
    assert adapter.layer_kinds == declared_by.layer_kinds_from(model.config)
    built = [{mixer for mixer, module in MIXER_MODULES.items() if getattr(layer, module, None) is not None}
             for layer in model.model.layers]
    assert [set(kind.split("+")) for kind in adapter.layer_kinds] == built
    assert adapter.recurrent_layers == tuple(i for i, mixers in enumerate(built) if mixers & {"gdn", "mamba2"})
    assert adapter.signal_layers == adapter.recurrent_layers


def test_every_adapter_has_a_tiny_model_and_its_own_model_types():
    assert {adapter for adapter, _, _ in TINY_CONFIGS.values()} == set(ADAPTERS)
    assert len(MODEL_TYPES) == sum(len(adapter.model_types) for adapter in ADAPTERS)
    assert sorted(FAMILIES) == sorted(TINY_CONFIGS)


def test_a_model_without_an_attention_layer_is_refused():
    with pytest.raises(ValueError, match=r"BambaForCausalLM has no attention layer \(layer kinds: mamba2\): it has no "
                                         "KV cache to compress"):
        adapter_for(MODELS["bamba"](attn_layer_indices=[]))
