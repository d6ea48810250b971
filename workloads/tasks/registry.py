"""The task registry: every task family, the tasks it holds, the named groups, and how an item is built.

A family turns ``(task, index)`` into an :class:`~workloads.tasks.items.Item` for one run's :class:`TaskSettings`; the
bench never tests a task's name to decide how to build it. A new family is one class here (or in its own module)
plus its entry in :data:`FAMILIES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from runtime.errors import UsageError

from ..haystacks import check_haystack
from .items import Item
from .ruler import GENERATED, HAYSTACK_TASKS, PROFILES, TASKS, Config, generate
from .scbench import SCBENCH_TASKS, load_rows, to_item


@dataclass(frozen=True)
class TaskSettings:
    """What items depend on besides their task and index.

    Attributes
    ----------
    length : int
        Target context length in tokens.
    encode : Callable[[str], list[int]]
        The model's tokenizer (token counts, SCBench's truncation).
    decode : Callable[[list[int]], str]
    profile : str
        RULER's template profile (:data:`workloads.tasks.ruler.PROFILES`).
    seed : int
    haystack : str
        ``generated``, or a real-text source of :data:`workloads.corpus.HAYSTACK_SOURCES`.
    scbench_data : Path, optional
        A local copy of SCBench.
    """

    length: int
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    profile: str = "compact"
    seed: int = 0
    haystack: str = GENERATED
    scbench_data: Path | None = None


class TaskFamily(ABC):
    """A family of tasks built the same way; :meth:`builder` returns ``index -> Item`` (None past the last one)."""

    name: ClassVar[str]
    tasks: ClassVar[tuple[str, ...]]

    def check(self, tasks: list[str], scbench_data: Path | None, haystack: str) -> None:
        """``ValueError`` for settings these tasks cannot be built with, before anything loads."""

    @abstractmethod
    def builder(self, task: str, settings: TaskSettings) -> Callable[[int], Item | None]:
        """``index -> Item`` for ``task`` (its data read once, here), None past the family's last item."""


class RulerFamily(TaskFamily):
    """RULER's 13 synthetic tasks, generated offline (:mod:`workloads.tasks.ruler`)."""

    name = "ruler"
    tasks = TASKS

    def check(self, tasks: list[str], scbench_data: Path | None, haystack: str) -> None:
        if haystack != GENERATED:
            check_haystack(haystack)

    def builder(self, task: str, settings: TaskSettings) -> Callable[[int], Item | None]:
        config = Config(profile=settings.profile, length=settings.length,
                        count_tokens=lambda text: len(settings.encode(text)), haystack=settings.haystack)
        return lambda index: generate(task, index, settings.seed, config)


class ScbenchFamily(TaskFamily):
    """SCBench's 12 tasks in shared-context multi-query mode, read from a local copy
    (:mod:`workloads.tasks.scbench`)."""

    name = "scbench"
    tasks = tuple(f"scbench_{t}" for t in SCBENCH_TASKS)

    def check(self, tasks: list[str], scbench_data: Path | None, haystack: str) -> None:
        if scbench_data is None:
            raise UsageError("SCBench tasks read a local copy of microsoft/SCBench: pass --scbench-data DIR")

    def builder(self, task: str, settings: TaskSettings) -> Callable[[int], Item | None]:
        name = task.removeprefix("scbench_")
        rows = load_rows(name, settings.scbench_data)

        def item(index: int) -> Item | None:
            if index >= len(rows):  # a task with fewer rows than --n
                return None
            return to_item(name, rows[index], index, settings.encode, settings.decode, settings.length)

        return item


FAMILIES: tuple[TaskFamily, ...] = (RulerFamily(), ScbenchFamily())
GROUPS: dict[str, tuple[str, ...]] = {
    "ruler": TASKS,
    "niah": tuple(t for t in TASKS if t.startswith("niah")),
    "scbench": ScbenchFamily.tasks,
    "haystack": HAYSTACK_TASKS,
}
"""Named groups of tasks (``--tasks ruler``); ``haystack``: the tasks whose filler ``--haystack`` chooses."""
ALL_TASKS: tuple[str, ...] = tuple(task for family in FAMILIES for task in family.tasks)


def family_of(task: str) -> TaskFamily:
    """The family that builds ``task``; ``ValueError`` naming the tasks and groups otherwise."""
    for family in FAMILIES:
        if task in family.tasks:
            return family
    raise UsageError(f"unknown task {task!r}; available: {', '.join(ALL_TASKS)} (or the groups {', '.join(GROUPS)})")


def expand(names: list[str]) -> list[str]:
    """Task names with groups expanded, in order; a task named twice (itself twice, or itself and a group that
    holds it) is a :class:`~runtime.errors.UsageError`, as a length given twice is: it would be run and reported
    twice, or one of the two namings silently dropped."""
    out: list[str] = []
    named_by: dict[str, str] = {}
    for name in names:
        for task in GROUPS.get(name, (name,)):
            if task in named_by:
                how = "twice" if named_by[task] == name == task else \
                    f"by {' and by '.join(repr(n) for n in (named_by[task], name))}"
                raise UsageError(f"--tasks {','.join(names)}: {task} is named {how}; name each task once")
            named_by[task] = name
            out.append(task)
    return out


def reads_haystack(task: str) -> bool:
    """Whether ``--haystack`` chooses this task's filler text."""
    return task in HAYSTACK_TASKS


def check(names: list[str], profile: str, haystack: str, scbench_data: Path | None) -> None:
    """Every error of a task selection knowable before the model loads, as one ``ValueError``."""
    if not names:
        raise UsageError(f"--tasks is empty; give at least one of: task names or the groups {', '.join(GROUPS)}")
    tasks = expand(names)
    by_family: dict[str, list[str]] = {}
    for task in tasks:
        by_family.setdefault(family_of(task).name, []).append(task)
    for family in FAMILIES:
        if family.name in by_family:
            family.check(by_family[family.name], scbench_data, haystack)
    if haystack != GENERATED:
        check_haystack(haystack)
        if not any(reads_haystack(task) for task in tasks):
            raise UsageError(f"--haystack {haystack}: none of the tasks reads a haystack; those that do: "
                             f"{', '.join(HAYSTACK_TASKS)} (the group 'haystack')")
    if scbench_data is not None and ScbenchFamily.name not in by_family:
        raise UsageError(f"--scbench-data {scbench_data}: none of the tasks reads SCBench; those that do: "
                         f"{', '.join(ScbenchFamily.tasks)} (the group 'scbench')")
    if profile not in PROFILES:
        raise UsageError(f"unknown template profile {profile!r}; choose from {', '.join(PROFILES)}")


def haystack_of(task: str, haystack: str) -> str:
    """The haystack rows of ``task`` record under ``--haystack haystack``."""
    return haystack if reads_haystack(task) else GENERATED
