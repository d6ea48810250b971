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


def test_the_shipped_model_is_refused_with_every_reason_before_vllm_starts():
    """The shipped byte model is a Qwen3.5 with GDN head dim 32 stored in float32: each obstacle is named, and the
    engine refuses it before importing vLLM (this environment has none, so reaching vLLM would be an ImportError)."""
    with pytest.raises(ValueError) as refused:
        check_request(["keydiff"], ["flat"], 1, "float32", SHIPPED)
    message = str(refused.value)
    assert message.startswith(f"model '{SHIPPED}' (qwen3_5_text) does not run in the vLLM engine: ")
    assert "needs torchvision" in message and "accepts GDN head dims 64, 128, this model's are 32" in message
    assert "runs bfloat16 only, not dtype 'float32'" in message
    with pytest.raises(ValueError, match="needs torchvision"):
        CompactingLLM(SHIPPED, dtype="bfloat16")


def test_dtypes_the_gdn_op_cannot_run_are_refused(next_dir):
    with pytest.raises(ValueError, match=r"\(qwen3_next\) does not run in the vLLM engine: vLLM's CPU GDN op runs "
                                         "bfloat16 only, not dtype 'float32'"):
        CompactingLLM(str(next_dir), dtype="float32")
    config = json.loads((next_dir / "config.json").read_text())
    (next_dir / "config.json").write_text(json.dumps({**config, "linear_key_head_dim": 96}))
    with pytest.raises(ValueError, match="accepts GDN head dims 64, 128, this model's are 96, 128$"):
        check_request([], [], 1, "bfloat16", next_dir)


def test_other_model_types_and_missing_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="the engine serves a local model directory with a config.json"):
        check_request([], [], 1, "bfloat16", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"\(llama\): the engine serves model types qwen3_next$"):
        check_request([], [], 1, "bfloat16", tmp_path)


@pytest.mark.parametrize("press,reason", [
    ("kvpress:KnormPress", "kvpress presses do not run in the engine: the serving environment has no kvpress"),
    ("kvpress:snapkv", "kvpress presses do not run in the engine"),
    ("kvzip", "does not run in the engine: its reconstruction pass"),
    ("nonsense", "does not run in the engine; presses there: keydiff, gatesight, triattention, snapkv$"),
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
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        with pytest.raises(ValueError, match=f"{name}=2: the engine compacts on one worker process"):
            CompactingLLM(str(next_dir), **{name: 2})
