"""Byte-level tokenizer: ids 0–255 are the bytes themselves, then four special tokens for the chat turns."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>")
# ChatML, the framing every task and training row uses (``<|im_start|>role\ncontent<|im_end|>\n``), so that
# ``apply_chat_template`` and pipelines built on it (kvpress's) produce exactly the ids the model was trained on.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-character map, the alphabet of tokenizers' ByteLevel pre-tokenizer
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The default model's tokenizer: one token per byte (ids 0-255), then :data:`SPECIAL_TOKENS`; no merges."""
    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    for offset, token in enumerate(SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=None, eos_token="<|im_end|>", pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
