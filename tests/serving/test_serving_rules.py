"""What the vLLM engine accepts, decided before vLLM starts (``serving.rules``): runs in every environment, since
the checks read only the request and the model's config.json."""

import ast
import json
from pathlib import Path

import pytest

import serving
from serving import CompactingLLM, check_request

SHIPPED = "models/hybrid-byte-12l"


@pytest.fixture
def next_dir(tmp_path):
    """A Qwen3-Next config whose GDN head dims vLLM's CPU kernel accepts (no weights: nothing is loaded)."""
    config = {"model_type": "qwen3_next", "linear_key_head_dim": 64, "linear_value_head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_request_the_engine_runs_passes(next_dir):
    assert serving.engine_presses() == ["gatesight", "snapkv", "triattention", "keydiff", "kvzip"]
    assert serving.engine_allocators() == ["flat", "gate", "pyramid", "perlayer"]
    check_request(serving.engine_presses(), serving.engine_allocators(), 1, "bfloat16", next_dir)


def test_the_shipped_model_passes_in_both_engine_dtypes():
    """The shipped byte model (a Qwen3.5 with GDN head dim 32, float32) runs in the engine: its GDN layers take the
    plugin's pure-torch path (tests/serving/test_serving_vllm.py runs it)."""
    for dtype in ("float32", "bfloat16"):
        check_request(["gatesight", "kvzip"], ["gate", "flat"], 1, dtype, SHIPPED)


def test_dtypes_the_engine_was_not_tested_in_are_refused_before_vllm_starts(next_dir):
    """This environment may have no vLLM: a refusal here comes before any import of it."""
    with pytest.raises(ValueError, match="dtype 'float16': the engine runs bfloat16, float32$"):
        CompactingLLM(str(next_dir), dtype="float16")


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_checkpoints_as_the_hub_lays_them_out_pass_and_are_served_text_only(tmp_path, model_type):
    config = {"model_type": model_type, "text_config": {"model_type": f"{model_type}_text"}, "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    check_request(["gatesight"], ["gate"], 1, "bfloat16", tmp_path)
    assert serving.rules.is_multimodal(tmp_path) and not serving.rules.is_multimodal(SHIPPED)


def test_other_model_types_and_missing_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="the engine serves a local model directory with a config.json"):
        check_request([], [], 1, "bfloat16", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"\(llama\) does not run in the vLLM engine; the engine serves model types "
                                         "qwen3_5_text, qwen3_5, qwen3_5_moe_text, qwen3_5_moe, qwen3_next$"):
        check_request([], [], 1, "bfloat16", tmp_path)


@pytest.mark.parametrize("press,reason", [
    ("kvpress:KnormPress", "kvpress presses do not run in the engine: the serving environment has no kvpress"),
    ("kvpress:snapkv", "kvpress presses do not run in the engine"),
    ("nonsense", "does not run in the engine; presses there: gatesight, snapkv, triattention, keydiff, kvzip$"),
])
def test_presses_the_engine_cannot_run_are_refused_with_the_reason(next_dir, press, reason):
    with pytest.raises(ValueError, match=f"press '{press}' {reason}" if not press.startswith("kvpress")
                       else f"press '{press}': {reason}"):
        check_request(["keydiff", press], ["flat"], 1, "bfloat16", next_dir)


@pytest.mark.parametrize("allocator,reason", [
    ("adakv", "it gives the heads of a layer different counts; vLLM's paged attention kernels take one sequence "
              "length per request and layer"),
    ("global", "its top-B over \\(layer, head, entry\\) gives the heads of a layer different counts"),
    ("nonsense", "does not run in the engine; allocators there: flat, gate, pyramid, perlayer$"),
])
def test_allocators_the_engine_cannot_run_are_refused_with_the_reason(next_dir, allocator, reason):
    with pytest.raises(ValueError, match=f"allocator '{allocator}' (does not run in the engine: )?{reason}"):
        check_request(["keydiff"], ["gate", allocator], 1, "bfloat16", next_dir)


def test_jobs_and_parallel_engines_are_refused(next_dir):
    with pytest.raises(ValueError, match="jobs=2: the vLLM engine runs in one process"):
        check_request(["keydiff"], ["flat"], 2, "bfloat16", next_dir)
    with pytest.raises(ValueError, match="speculative_config: the engine does not run speculative decoding"):
        CompactingLLM(str(next_dir), speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        with pytest.raises(ValueError, match=f"{name}=2: the engine compacts on one worker process"):
            CompactingLLM(str(next_dir), **{name: 2})


def test_press_options_are_checked_before_vllm_starts():
    """This environment may have no vLLM: the press's options are refused before any import of it."""
    with pytest.raises(ValueError, match="kvzip has no option 'bogus'; valid: chunk_size"):
        CompactingLLM(SHIPPED, press="kvzip", dtype="float32", press_options={"bogus": 1})
    with pytest.raises(ValueError, match="chunk_size=0: expected an integer >= 1"):
        CompactingLLM(SHIPPED, press="kvzip", dtype="float32", press_options={"chunk_size": 0})


# vLLM's private attributes that serving/vllm_internals/ reads or replaces: no other module of serving names one
_PRIVATE_VLLM = {
    "engine_core", "kv_cache_manager", "block_pool", "coordinator", "single_type_managers", "req_to_blocks", "ref_cnt",
    "block_id", "requests", "num_computed_tokens", "num_output_tokens", "allocate_slots", "get_block_ids",
    "get_num_free_blocks", "model_runner", "model_config", "kv_cache_config", "kv_cache_groups", "kv_cache_spec",
    "layer_names", "compilation_config", "static_forward_context", "kv_cache", "impl", "do_kv_cache_update",
    "input_batch", "execute_model", "block_table", "attn_groups", "metadata_builders", "compute_slot_mapping",
    "prefix", "rearrange_mixed_qkv", "num_v_heads", "head_v_dim", "fused_gdn_gating_cpu", "forward_cpu",
    "in_proj_qkvz", "in_proj_ba", "attn_metadata", "get_vocab_size", "max_model_len",
}
# what serving imports of vLLM outside vllm_internals: its public API
_PUBLIC_VLLM = {"vllm": {"LLM", "SamplingParams"}, "vllm.inputs": {"TokensPrompt"}}


def test_private_vllm_names_are_only_in_vllm_internals():
    """The README's claim: every private name of vLLM that the plugin uses is in ``serving/vllm_internals/``. No
    other module of ``serving`` reads one of the private attributes read there (but through that package's
    functions) or imports vLLM beyond its public API."""
    found = []
    for path in sorted(Path(serving.__file__).parent.glob("*.py")):  # the package's own modules are one level down
        tree = ast.parse(path.read_text())
        internals = _vllm_internals_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in _PRIVATE_VLLM and not _is_vllm_internals(node.value,
                                                                                                     internals):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                names = {alias.name for alias in node.names}
                if not names <= _PUBLIC_VLLM.get(node.module, set()):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {sorted(names)}")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
                found.append(f"{path.name}:{node.lineno} import {[a.name for a in node.names]}")
    assert not found, found


def _vllm_internals_names(tree) -> set[str]:
    """The names a module binds to ``serving.vllm_internals`` or its modules (``from .vllm_internals import runner as
    vi``)."""
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.level == 1 and (node.module or "").split(".")[0] == "vllm_internals" for alias in node.names}


def _is_vllm_internals(node, names: set[str]) -> bool:
    """Whether an expression names a module of ``serving.vllm_internals``: one of ``names``
    (:func:`_vllm_internals_names`), or the engine's ``self._vi``."""
    return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute)
                                                                 and node.attr == "_vi")
