"""The values the allocator hands out and takes back.

They are frozen so the manager can keep them in the state file and compare
them, and plain so they survive a JSON round trip without the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass


class PlacementError(Exception):
    """A claim could not be placed; the message says what is missing."""


class NeverFits(PlacementError):
    """The claim can not fit on this machine even when it is empty."""


class DoesNotFitNow(PlacementError):
    """The claim fits this machine, but not with what is in use now."""


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
