"""Runtime core: prefill a hybrid model once, fork physically compacted children, answer exactly."""

from .adapters import ModelAdapter, adapter_for
from .decoding import Answer
from .evidence import Evidence, EvidenceRequest
from .forward import SequenceState, forward_chunk
from .gdn import RecurrentState
from .kv import LayerKV
from .plan import KeepPlan
from .session import DEFAULT_PREFILL_CHUNK, Child, Parent, context_hash, prefill
from .tokens import CHATML_ASSISTANT_TURN, encode_text

__all__ = [
    "CHATML_ASSISTANT_TURN", "DEFAULT_PREFILL_CHUNK", "Answer", "Child", "Evidence", "EvidenceRequest", "KeepPlan",
    "LayerKV", "ModelAdapter", "Parent", "RecurrentState", "SequenceState", "adapter_for", "context_hash",
    "encode_text", "forward_chunk", "prefill",
]
