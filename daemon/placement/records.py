"""The values the allocator hands out and takes back.

They are frozen so the manager can keep them in the state file and compare
them, and plain so they survive a JSON round trip without the allocator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from computegroups.daemon.placement.explain import reasons_text


class PlacementError(Exception):
    """A claim could not be placed; the message says what is missing."""


class NeverFits(PlacementError):
    """The claim can not fit on this machine even when it is empty."""


class DoesNotFitNow(PlacementError):
    """The claim fits this machine, but not with what is in use now.

    Besides the message, the parts it is made of: `reasons`, the GPUs that
    could not be used, by why (`label` says how they are introduced), and
    `holders`, the groups whose use of a GPU is its reason. The allocator
    knows groups, not people: a caller that knows whose groups they are
    words the reasons again (`worded`) to name them.
    """

    def __init__(self, head: str, reasons: Mapping[int, str] | None = None, *, label: str = "not free",
                 holders: Mapping[int, frozenset[str]] | None = None, note: str = "") -> None:
        self.head = head
        self.reasons = dict(reasons or {})
        self.label = label
        self.holders = dict(holders or {})
        self.note = note
        super().__init__(self.worded(self.reasons))

    def worded(self, reasons: Mapping[int, str]) -> str:
        """The message with `reasons` (the GPUs of `self.reasons`, in other words) in place of the allocator's."""
        return self.head + (f" ({self.label}: {reasons_text(reasons)})" if reasons else "") + self.note

    def noted(self, note: str) -> DoesNotFitNow:
        """The same refusal with `note` after it."""
        return DoesNotFitNow(self.head, self.reasons, label=self.label, holders=self.holders, note=self.note + note)


@dataclass(frozen=True)
class DeviceShare:
    """One device of a group and what it takes of it.

    A whole GPU takes all its memory and `compute_pct` 100; a MIG instance is
    a whole device too (`whole`, its own memory, 100% of its own SMs); a share
    takes `memory_mib` and `compute_pct` of one GPU (0 = no SMs reserved).
    """

    gpu: int
    mig_uuid: str | None
    memory_mib: int
    compute_pct: int
    whole: bool


@dataclass(frozen=True)
class Score:
    """Why this set: the interconnect inside it and one sentence for people.

    `nvlinks` is the sum over the pairs of the set of their NVLink counts,
    `pcie` the sum of their PCIe closeness (5 same board .. 0 across sockets),
    `best_nvlinks` the most any set of this size could have on the empty
    machine, `proven` whether the search ran to the end.
    """

    nvlinks: int
    pcie: int
    explanation: str
    pairs: int = 0
    best_nvlinks: int = 0
    proven: bool = True


@dataclass(frozen=True)
class Placement:
    group_id: str
    devices: tuple[DeviceShare, ...]
    domain: frozenset[int] | None
    exclusive_domain: frozenset[int] | None
    score: Score
    displaced: tuple[str, ...] = ()

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({d.gpu for d in self.devices}))


@dataclass(frozen=True)
class Holding:
    """Everything needed to account for one live group again after a restart.

    `reserved` is True while the group is a reservation nobody has taken:
    only such holdings can be displaced by a higher-priority claim.
    """

    group_id: str
    devices: tuple[DeviceShare, ...]
    owner: str
    users: frozenset[str] = frozenset()
    exclusive_domain: frozenset[int] | None = None
    priority: int = 0
    reserved: bool = False
    cpus: int = 0


@dataclass(frozen=True)
class GpuUse:
    """One GPU as the allocator sees it, for status pages and error messages."""

    gpu: int
    memory_mib: int
    memory_free_mib: int
    memory_foreign_mib: int
    compute_free_pct: int
    whole_free: bool
    available: bool
    mig: bool
    groups: tuple[str, ...]
    exclusive_group: str | None
