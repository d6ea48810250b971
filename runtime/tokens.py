"""Text to token ids, one way everywhere: contexts, questions, answers and prompts never get special tokens."""

from __future__ import annotations

CHATML_ASSISTANT_TURN = "<|im_end|>\n<|im_start|>assistant\n"
"""Closes a ChatML user turn and opens the assistant's reply (Qwen's chat framing)."""


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (no BOS): a context and a question appended to it must encode
    to the same ids as their concatenation would, whichever model's tokenizer this is."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]
