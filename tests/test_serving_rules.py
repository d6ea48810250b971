"""What the vLLM engine accepts, decided before vLLM starts (``serving.rules``): runs in every environment, since
the checks read only the request and the model's config.json."""

import json

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
    check_request(list(serving.ENGINE_PRESSES), list(serving.ENGINE_ALLOCATORS), 1, "bfloat16", next_dir)


def test_the_shipped_model_passes_in_both_engine_dtypes():
    """The shipped byte model (a Qwen3.5 with GDN head dim 32, float32) runs in the engine: its GDN layers take the
    plugin's pure-torch path (tests/test_serving_vllm.py runs it)."""
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
                                         "qwen3_next, qwen3_5_text, qwen3_5_moe_text, qwen3_5, qwen3_5_moe$"):
        check_request([], [], 1, "bfloat16", tmp_path)


@pytest.mark.parametrize("press,reason", [
    ("kvpress:KnormPress", "kvpress presses do not run in the engine: the serving environment has no kvpress"),
    ("kvpress:snapkv", "kvpress presses do not run in the engine"),
    ("nonsense", "does not run in the engine; presses there: keydiff, gatesight, triattention, snapkv, kvzip$"),
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
