"""vLLM's model registry (:mod:`serving.vllm_internals`): its Qwen3.5 classes registered so that they load without
torchvision.
"""

from __future__ import annotations

QWEN3_5_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
                         "Qwen3_5MoeForConditionalGeneration")
"""vLLM's Qwen3.5 classes the plugin registers: the language models alone, and the checkpoints as the hub lays them
out (vision tower included; the engine serves them text-only)."""


def register_qwen3_5_without_torchvision() -> None:
    """Make vLLM's Qwen3.5 classes (:data:`QWEN3_5_ARCHITECTURES`) load without torchvision.

    vLLM's Qwen3.5 module imports its Qwen3-VL image processor, whose transformers module imports torchvision; the
    serving environment has none (the torchvision for torch 2.13 is a CUDA build that does not load beside the CPU
    torch). Where that import fails for want of torchvision, transformers' own torchvision-free image processor
    (``Qwen2VLImageProcessorPil``, which transformers falls back to itself) stands in for the module; the engine
    sends no image (:class:`serving.CompactingLLM` builds multimodal checkpoints with no image or video per prompt).
    The classes are then registered in this process, so vLLM inspects them here and not in a subprocess without the
    stand-in.
    """
    import importlib
    import sys
    import types

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != "torchvision":
            raise
        pil = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
        stand_in = types.ModuleType(name)
        stand_in.smart_resize, stand_in.Qwen2VLImageProcessor = pil.smart_resize, pil.Qwen2VLImageProcessorPil
        sys.modules[name] = stand_in
    from vllm import ModelRegistry
    from vllm.model_executor.models import qwen3_5

    for architecture in QWEN3_5_ARCHITECTURES:
        ModelRegistry.register_model(architecture, getattr(qwen3_5, architecture))
