"""What a distilled hybrid's delta ships besides its mixers: the GateSight estimator and the calibration of the model
rebuilt from it (:data:`pretrained.catalog.DELTA_ARTIFACTS`), copied in by :func:`ship_artifacts` so that every
later rebuild (:func:`hybridmodel.hybrid_delta.rebuild`) carries them, and held to the weights they were made on
(:func:`check_estimator_weights`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from artifacts.files import backup_path, write_text
from presses.gatesight import ARTIFACT_DIR
from pretrained.catalog import DELTA_ARTIFACTS
from pretrained.file_record import record_again
from pretrained.loading import fingerprint
from pretrained.model_cache import CACHE_ENV, SOURCE_FILE, cache_dir, installed, source_hash
from runtime.bounded_read import METADATA_LIMIT, read_text_bounded
from runtime.errors import UsageError


def check_estimator_weights(directory: Path, weights: str, what: str) -> None:
    """``ValueError`` if the GateSight estimator in ``directory/gatesight`` records weights other than ``weights``
    (an estimator saved before estimators recorded them passes)."""
    config = Path(directory) / ARTIFACT_DIR / "gatesight.json"
    if not config.exists():
        return
    settings = read_text_bounded(config, METADATA_LIMIT, "train the estimator again (`bench train --replace`)")
    trained_on = json.loads(settings).get("meta", {}).get("weights")
    if trained_on is not None and trained_on != weights:
        raise UsageError(f"{config.parent} was trained on model weights {trained_on}, not {what}'s ({weights}): "
                         "train it again on this model (`bench label`, then `bench train --replace`)")


def _new_artifacts(name: str, env: str) -> str:
    """The commands that make a new estimator and calibration of the rebuilt hybrid ``name`` (``env``: the cache's
    variable, where it is not the default), replacing those it carries (a rebuild carries what its delta ships)."""
    return (f"`{env}bench label --model {name} --out LABELS` and `{env}bench train --model {name} --labels LABELS "
            f"--replace` for an estimator, `{env}bench calibrate --model {name} --replace` for a calibration")


def ship_artifacts(checkpoint, root: Path, log=print) -> list[Path]:
    """Copy the GateSight estimator and the calibration of the hybrid rebuilt from ``checkpoint``'s delta (in
    ``root``) into the delta, so that every later rebuild carries them (:data:`pretrained.catalog.DELTA_ARTIFACTS`).

    A folder the delta holds already with other files is moved aside to ``<folder>.backup-<time>`` first. The
    rebuilt directory then records the delta's new hash: it is what a rebuild from the delta now gives.

    Returns
    -------
    list[Path]
        The delta's artifact folders written.

    Raises
    ------
    FileNotFoundError
        The hybrid is not rebuilt from the current delta in ``root``.
    ValueError
        It holds neither an estimator nor a calibration, or an estimator trained on other weights.
    """
    import filecmp

    directory = installed(checkpoint, Path(root))
    if directory is None:  # the commands for the cache given: --cache to fetch, the variable for the others
        cache = "" if Path(root) == cache_dir() else f" --cache {Path(root).parent}"
        env = "" if not cache else f"{CACHE_ENV}={Path(root).parent} "
        raise FileNotFoundError(f"{checkpoint.name} is not rebuilt from {checkpoint.delta_dir} in {root}: run "
                                f"`bench fetch-model {checkpoint.name}{cache}` (the rebuild carries what the delta "
                                f"ships), then {_new_artifacts(checkpoint.name, env)}, then this command again")
    present = [folder for folder in DELTA_ARTIFACTS if any(p.is_file() for p in (directory / folder).glob("*"))]
    if not present:
        raise UsageError(f"{directory} holds no GateSight estimator nor calibration: "
                         f"{_new_artifacts(checkpoint.name, '')} first")
    check_estimator_weights(directory, fingerprint(directory, "weights"), str(directory))
    written = []
    for folder in present:
        source, target = directory / folder, checkpoint.delta_dir / folder
        if target.exists():
            compared = filecmp.dircmp(source, target)
            if not (compared.left_only or compared.right_only or compared.diff_files or compared.funny_files):
                log(f"{target}: already the same as {source}")
                continue
            aside = backup_path(target)
            target.rename(aside)
            log(f"{target}: the previous one moved aside to {aside}")
        shutil.copytree(source, target, ignore=lambda _, names: [n for n in names if not (source / n).is_file()])
        written.append(target)
        log(f"{target}: copied from {source}")
    if written:
        record_again(checkpoint.delta_dir)  # the shipped delta's record holds its artifacts
    record = json.loads(read_text_bounded(directory / SOURCE_FILE, METADATA_LIMIT,
                                          f"convert it again (`bench fetch-model {checkpoint.name}`)"))
    write_text(directory / SOURCE_FILE, json.dumps({**record, "sha256": source_hash(checkpoint)}, indent=2) + "\n")
    return written
