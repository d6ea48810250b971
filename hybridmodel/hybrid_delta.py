"""A distilled hybrid stored as what distillation changed: its token mixers (every GDN layer and the kept attention
layers), beside the config, the hash of the teacher file they were trained against and the digest of that teacher's
converted weights. Everything else (embeddings, MLPs, norms) is the teacher's, converted exactly
(:func:`hybridmodel.from_teacher.carry_over`), so the full model is rebuilt from the packaged teacher by
:func:`rebuild` — and only from a teacher of that hash whose converted weights are the recorded ones.

Storage (:func:`save`): every 2-D weight of the mixers (the projections: 99.8 % of the parameters) in int8 with one
float32 scale per output row (symmetric absmax, ``<name>`` int8 and ``<name>.scale``), the rest — the GDN layers'
``A_log``, ``dt_bias``, short convolutions and norms, the attention layers' q/k norms (0.2 % of the parameters) —
in float32: they set decay rates and normalisation scales that every position compounds, and rounding them would
save 0.2 MB. A delta written before (every tensor in bfloat16) still reads.

A delta may also carry what the bench derived from its rebuilt model — the GateSight estimator and the calibration
(:data:`pretrained.catalog.DELTA_ARTIFACTS`, put there by
:func:`hybridmodel.delta_artifacts.ship_artifacts`) — so that a fresh checkout runs
GateSight without labelling. They belong to its mixers: new mixers written over a delta move them aside.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from artifacts.files import backup_path
from pretrained.catalog import DELTA_ARTIFACTS, MIXERS_FILE
from pretrained.file_record import write_record
from pretrained.loading import fingerprint
from pretrained.model_cache import (
    SOURCE_FILE,
    check_recorded,
    conversion_problem,
    file_records,
    sha256_of,
    source_hash,
)
from runtime.bounded_read import METADATA_LIMIT, read_text_bounded
from runtime.errors import UsageError

from .delta_artifacts import check_estimator_weights
from .from_teacher import carry_over

MANIFEST_FILE = "hybrid.json"
MIXERS = (".linear_attn.", ".self_attn.")
"""Parameter-name parts of the token mixers: a GDN layer's, a kept attention layer's."""
SCALE = ".scale"
"""The suffix of an int8 weight's per-row scales in the mixers file."""
STORAGE = "int8 per output row (float32 scales); float32 for tensors that are not 2-D"
"""What the manifest's ``dtype`` says of a delta :func:`save` writes (older deltas: ``bfloat16``)."""


def mixer_state(student, kinds: tuple[str, ...] = MIXERS) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` of the token mixers of ``kinds`` (by default every one: what :func:`save` stores)."""
    return {name: p for name, p in student.named_parameters() if any(kind in name for kind in kinds)}


def quantise_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of a 2-D weight: each output row scaled by its largest magnitude / 127.

    Parameters
    ----------
    weight : torch.Tensor
        ``[rows, columns]``.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        int8 ``[rows, columns]`` in [-127, 127] and float32 scales ``[rows]``: ``weight ≈ q * scale[:, None]``,
        within half a scale of it everywhere, each row's largest magnitude kept to float rounding (a zero row:
        scale 0).
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    q = torch.round(w / scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None]).clamp(-127, 127)
    return q.to(torch.int8), scale


def dequantise_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``[rows, columns]`` of :func:`quantise_rows`'s ``q`` ``[rows, columns]`` and ``scale`` ``[rows]``."""
    return q.float() * scale.float()[:, None]


def stored_tensors(student) -> dict[str, torch.Tensor]:
    """What :func:`save` writes of ``student``'s mixers: ``<name>`` int8 and ``<name>.scale`` for every 2-D weight,
    ``<name>`` float32 for the rest."""
    tensors = {}
    for name, p in mixer_state(student).items():
        if p.dim() == 2:
            tensors[name], tensors[name + SCALE] = quantise_rows(p)
        else:
            tensors[name] = p.detach().float()
    return {name: t.contiguous() for name, t in tensors.items()}


def weights_digest(directory: Path) -> str:
    """SHA-256 of a model directory's weights: every tensor of its ``model*.safetensors`` files in name order (its
    name, dtype, shape and bytes), whatever the files' layout or metadata. ``ValueError`` naming a file that is
    missing or damaged."""
    directory = Path(directory)
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        raise UsageError(f"{directory} holds no model*.safetensors weights: remove it and fetch it again")
    digest = hashlib.sha256()
    try:
        opened = [safe_open(str(path), framework="pt") for path in files]
        where = {name: weights for weights in opened for name in weights.keys()}
        for name in sorted(where):  # one tensor in memory at a time
            t = where[name].get_tensor(name).contiguous()
            digest.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().data)
    except (SafetensorError, OSError) as error:
        raise UsageError(f"the weights in {directory} are damaged ({error}): remove it and fetch it again") from None
    return digest.hexdigest()


def save(student, out_dir: Path, teacher_sha256: str, record: dict, log=print,
         teacher_weights: str | None = None) -> Path:
    """Write the mixers (:func:`stored_tensors`: int8 per row, float32 scales and small tensors) and the manifest of
    ``student`` into ``out_dir``; the mixers file's path. Artifacts the delta carried for other mixers are moved
    aside to ``<folder>.backup-<time>`` first: they describe another model.

    Parameters
    ----------
    teacher_sha256 : str
        The SHA-256 of the teacher's packaged file.
    teacher_weights : str, optional
        :func:`weights_digest` of the teacher's converted directory: :func:`rebuild` refuses a teacher whose
        converted weights are not these, and a delta that records none.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = stored_tensors(student)
    partial = out_dir / (MIXERS_FILE + ".partial")
    save_file(tensors, partial)
    partial.chmod(0o644)  # safetensors writes through a private temporary file; the delta is shipped like the rest
    old = out_dir / MIXERS_FILE
    if old.exists() and sha256_of(old) != sha256_of(partial):
        for folder in DELTA_ARTIFACTS:
            if (out_dir / folder).exists():
                aside = backup_path(out_dir / folder)
                (out_dir / folder).rename(aside)
                log(f"{out_dir / folder} was derived from the mixers replaced now: moved aside to {aside}")
    partial.replace(old)
    manifest = {"teacher_sha256": teacher_sha256, **({"teacher_weights": teacher_weights} if teacher_weights else {}),
                "dtype": STORAGE, "config": student.config.to_dict(), "training": record}
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    write_record(out_dir)  # the delta as written: one changed in place later is never rebuilt nor run
    return out_dir / MIXERS_FILE


def load_mixers(delta_dir: Path) -> dict[str, torch.Tensor]:
    """``{name: float32 tensor}`` of a delta's mixers file: int8 weights dequantised by their scales (:func:`save`),
    other tensors (bfloat16 in a delta written before int8, float32 now) converted."""
    path = Path(delta_dir) / MIXERS_FILE
    stored = load_file(str(path))
    scales = {name[:-len(SCALE)]: t for name, t in stored.items() if name.endswith(SCALE)}
    out = {}
    for name, t in stored.items():
        if name.endswith(SCALE):
            if name[:-len(SCALE)] not in stored:
                raise UsageError(f"{path}: {name} scales no weight of the file")
        elif name in scales:
            if t.dtype != torch.int8 or t.dim() != 2 or scales[name].shape != (t.shape[0],):
                raise UsageError(f"{path}: {name} ({t.dtype}, {list(t.shape)}) does not fit its scales "
                                 f"{list(scales[name].shape)}: expected int8 rows with one scale each")
            out[name] = dequantise_rows(t, scales[name])
        elif t.dtype == torch.int8:
            raise UsageError(f"{path}: the int8 tensor {name} has no {name + SCALE}")
        else:
            out[name] = t.float()
    return out


def manifest(delta_dir: Path) -> dict:
    path = Path(delta_dir) / MANIFEST_FILE
    try:
        return json.loads(read_text_bounded(path, METADATA_LIMIT, "restore the delta directory (git checkout -- "
                                                                  "models/)"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no hybrid manifest (a delta directory holds {MANIFEST_FILE} and "
                                f"{MIXERS_FILE})") from None


def build(delta_dir: Path, teacher):
    """The float32 hybrid of ``delta_dir`` on ``teacher`` (whose file's hash the caller has checked)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig.from_dict(manifest(delta_dir)["config"])
    student = Qwen3_5ForCausalLM(config).float().eval()
    carry_over(student, teacher)
    mixers = load_mixers(delta_dir)
    expected = set(mixer_state(student))
    if set(mixers) != expected:
        missing, extra = sorted(expected - set(mixers)), sorted(set(mixers) - expected)
        raise UsageError(f"{delta_dir}: its mixers do not fit its config (missing {missing[:3]}, extra {extra[:3]})")
    student.load_state_dict(mixers, strict=False)  # copied into the float32 parameters
    return student


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
"""What the hybrid keeps of the teacher's directory as files: its tokenizer, chat template and stop tokens."""


def rebuild(checkpoint, root: Path, log=print) -> Path:
    """Rebuild the catalogued hybrid ``checkpoint`` (:class:`pretrained.DistilledCheckpoint`) into ``root/<name>``
    from its shipped delta on its teacher, which must be fetched into ``root`` already, be the file the delta was
    trained against and hold the converted weights the delta records (checked before anything is built); the
    artifacts the delta carries are copied in. The model is staged in ``root/.<name>.partial``, which any failure
    removes; a directory rebuilt from an older delta is moved aside first, never written over."""
    from transformers import AutoModelForCausalLM

    root = Path(root)
    delta = checkpoint.delta_dir
    check_recorded(delta, checkpoint.name)  # a delta changed in place (its files.json) is never rebuilt
    recorded = manifest(delta)
    wanted = recorded["teacher_sha256"]
    if wanted != checkpoint.teacher.sha256:
        raise UsageError(f"{delta} was distilled from a teacher file of SHA-256 {wanted}, not the catalogued "
                         f"{checkpoint.teacher.name} ({checkpoint.teacher.sha256})")
    if "teacher_weights" not in recorded:
        raise UsageError(f"{delta / MANIFEST_FILE} records no digest of its teacher's converted weights "
                         "(teacher_weights): save the delta again with hybridmodel.hybrid_delta.save(..., "
                         "teacher_weights=weights_digest(TEACHER_DIR))")
    teacher_dir = root / checkpoint.teacher.name
    problem = conversion_problem(checkpoint.teacher, root)
    if problem is not None and problem.startswith("is damaged"):
        raise UsageError(f"the teacher {checkpoint.teacher.name} in {teacher_dir} {problem}: run `bench fetch-model "
                         f"{checkpoint.teacher.name}` to convert it again")
    if problem is not None:
        raise FileNotFoundError(f"{checkpoint.teacher.name} is not in {root} ({problem}): fetch it first")
    # by SHA-256, as fetch-model checks a conversion: a file changed in place (its size kept) is rebuilt, not kept
    done = root / checkpoint.name if conversion_problem(checkpoint, root, hashes=True) is None else None
    if done is not None:
        log(f"{checkpoint.name}: already rebuilt from this delta in {done}")
        return done
    found = weights_digest(teacher_dir)
    if found != recorded["teacher_weights"]:
        raise UsageError(f"the converted weights in {teacher_dir} (digest {found[:12]}) are not the ones {delta} was "
                         f"distilled against ({recorded['teacher_weights'][:12]}): the conversion was altered or "
                         f"damaged; remove {teacher_dir} and run `bench fetch-model {checkpoint.teacher.name}`")
    log(f"{checkpoint.name}: rebuilding from {delta} on {teacher_dir} ...")
    target = root / checkpoint.name
    staged = root / f".{checkpoint.name}.partial"
    shutil.rmtree(staged, ignore_errors=True)  # left by a rebuild that was killed
    try:
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32, local_files_only=True)
        student = build(delta, teacher)
        student.save_pretrained(staged)
        for name in TOKENIZER_FILES:
            if (teacher_dir / name).exists():
                shutil.copyfile(teacher_dir / name, staged / name)
        for folder in DELTA_ARTIFACTS:
            if (delta / folder).is_dir():
                shutil.copytree(delta / folder, staged / folder)
        check_estimator_weights(staged, fingerprint(staged, "weights"),
                                 f"the model rebuilt from {delta}")
        # the model's files, checked as a conversion's are; not the artifacts, which bench train and bench
        # calibrate replace in place
        files = {name: record for name, record in file_records(staged).items()
                 if name.split("/")[0] not in DELTA_ARTIFACTS}
        (staged / SOURCE_FILE).write_text(json.dumps(
            {"name": checkpoint.name, "sha256": source_hash(checkpoint), "teacher_sha256": wanted,
             "delta": str(delta), "files": files}, indent=2) + "\n")
        if target.exists():
            aside = backup_path(target)
            target.rename(aside)
            log(f"{checkpoint.name}: the directory rebuilt from an older delta was moved to {aside}")
        staged.rename(target)
    except BaseException:  # an interrupt too: a half-written model of 580 MB is never left behind
        shutil.rmtree(staged, ignore_errors=True)
        raise
    log(f"{checkpoint.name}: ready in {target}")
    return target
