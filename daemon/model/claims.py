"""What a compute group asks for, checked once at the door.

A claim arrives from JSON, TOML or the command line and is decoded straight
into `Claim` (`msgspec`), which states its own rules: types and ranges in the
annotations, the combinations in `__post_init__`. Everything below the API
(the manager, the allocator, the state file) trusts a `Claim` because of
that. `to_dict` is the one canonical form: the state file keeps it and
compares claims by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import msgspec
from msgspec import Meta

from computegroups.daemon.model.decoding import (
    PATTERN_PROBLEMS,
    ModelError,
    convert,
    to_plain,
)
from computegroups.daemon.model.enums import StrEnum
from computegroups.daemon.model.names import NAME_PATTERN, NAME_PROBLEM, NAME_RE
from computegroups.daemon.model.sharepolicy import SharingRules
from computegroups.daemon.model.sizes import parse_size
from computegroups.daemon.model.words import plural
from computegroups.topology.model import DomainKind

MAX_GPUS = 1024
MAX_CPUS = 65536

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
"""A component, group, reservation or deployment name: it becomes part of file names and group ids."""
PATTERN_PROBLEMS[NAME_PATTERN] = NAME_PROBLEM
_MIG_PATTERN = r"^\S(?:.*\S)?$"
PATTERN_PROBLEMS[_MIG_PATTERN] = "expected a MIG profile name such as '1g.10gb', got {value}"

ClaimError = ModelError
"""A malformed claim; the message starts with the path of the field."""


class Strategy(str, Enum):
    BINPACK = "binpack"
    SPREAD = "spread"


class Level(StrEnum):
    """How near an affinity term reaches: the same device, or the same topology domain."""

    DEVICE = "device"
    NVLINK = "nvlink"
    PCIE = "pcie"
    NUMA = "numa"
    MACHINE = "machine"


class _Colocate(StrEnum):
    """What the wire may say for `colocate`: a domain, or `none` for no rule."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    NUMA = "numa"
    MACHINE = "machine"
    NONE = "none"


class _Exclusive(StrEnum):
    """What the wire may say for `exclusive`: a whole machine is not a domain to hold alone."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    NUMA = "numa"
    NONE = "none"


# The wire accepts more than the value keeps (a size as text, `none` as a
# domain); `__post_init__` narrows them, so code below the API sees the
# narrow types that mypy is told about.
if TYPE_CHECKING:
    MemorySize: TypeAlias = int
    _ColocateIn: TypeAlias = DomainKind
    _ExclusiveIn: TypeAlias = DomainKind
else:
    MemorySize = Annotated[int, Meta(ge=1)] | str
    _ColocateIn = _Colocate
    _ExclusiveIn = _Exclusive


Percent = Annotated[int, Meta(ge=1, le=100)]
_CC_PATTERN = r"^[0-9]{1,2}\.[0-9]{1,2}$"
PATTERN_PROBLEMS[_CC_PATTERN] = "expected a compute capability such as '8.0', got {value}"


class ShareMode(StrEnum):
    WHOLE = "whole"
    SHARE = "share"
    ANY = "any"


class SameAttribute(StrEnum):
    """The device attributes `same` can hold equal across a request's devices."""

    MODEL = "model"


class AffinityTerm(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Another component this group should (or should not) sit next to.

    `level` is `device` (the same physical GPU) or a `DomainKind` value (the
    same NVLink island, PCIe switch, NUMA node or machine).
    """

    component: Name
    level: Level = Level.DEVICE

    def __post_init__(self) -> None:
        if not isinstance(self.level, Level):
            try:
                msgspec.structs.force_setattr(self, "level", Level(self.level))
            except ValueError:
                raise ValueError(f"level: must be one of {', '.join(Level)}, got {self.level!r}") from None
        if not NAME_RE.fullmatch(self.component):
            raise ValueError(f"component: {PATTERN_PROBLEMS[NAME_PATTERN].format(value=repr(self.component))}")

    @property
    def domain_kind(self) -> DomainKind | None:
        return None if self.level is Level.DEVICE else DomainKind(self.level.value)

    def to_dict(self) -> dict[str, str]:
        return {"component": self.component, "level": self.level.value}


class Claim(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One compute group's needs: whole GPUs, a share of one GPU, or a MIG device.

    Direct construction runs the same cross-field checks as decoding, so a
    claim built in code can not carry a combination the allocator was never
    designed for. Defaults are left out of the encoded form (`to_dict`).
    """

    gpus: Annotated[int, Meta(ge=1, le=MAX_GPUS)] | None = None
    memory_mib: MemorySize | None = None
    """MiB; the wire also takes a size such as "20GiB" (`parse_size`)."""
    compute_pct: Percent | None = None
    mig: Annotated[str, Meta(pattern=_MIG_PATTERN)] | None = None
    distinct: bool = False
    strategy: Strategy | None = None
    """None: the daemon's configured default (binpack unless configured)."""
    colocate: _ColocateIn | None = None
    exclusive: _ExclusiveIn | None = None
    pool: Annotated[str, Meta(min_length=1)] | None = None
    gpu_ids: Annotated[tuple[Annotated[int, Meta(ge=0)], ...], Meta(min_length=1)] | None = None
    priority: Annotated[int, Meta(ge=-1000, le=1000)] = 0
    allow_busy: bool = False
    affinity: tuple[AffinityTerm, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()
    share: ShareMode | None = None
    """`whole` (a whole device only), `share` (a share only) or `any` (a share, else a whole device) for
    a memory/compute claim; None: a share, as asked. DRA's "all of the device" vs "a share"."""
    model: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    """Device selector: the GPU's model name matches this glob (`*H100*`)."""
    min_memory_mib: MemorySize | None = None
    """Device selector: the GPU's total memory is at least this (MiB, or a size)."""
    compute_capability: Annotated[str, Meta(pattern=_CC_PATTERN)] | None = None
    """Device selector: the GPU's compute capability is at least this (`8.0`)."""
    same: SameAttribute | None = None
    """Every device of the request has the same value of this attribute (DRA's matchAttribute)."""
    cpus: Annotated[int, Meta(ge=1, le=MAX_CPUS)] | None = None
    """CPUs counted against the machine's (never oversubscribed); alone, a CPU-only claim with no
    device at all. At least 1: a claim of no CPUs would hold nothing."""

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        for key in ("memory_mib", "min_memory_mib"):
            if isinstance(getattr(self, key), str):
                try:
                    set_(self, key, parse_size(getattr(self, key)))
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None
        if self.share is not None and not isinstance(self.share, ShareMode):
            set_(self, "share", _enum(ShareMode, self.share, "share", ()))
        if self.same is not None and not isinstance(self.same, SameAttribute):
            set_(self, "same", _enum(SameAttribute, self.same, "same", ()))
        if self.strategy is not None and not isinstance(self.strategy, Strategy):
            set_(self, "strategy", _enum(Strategy, self.strategy, "strategy", ()))
        for key in ("colocate", "exclusive"):
            value = getattr(self, key)
            if value is not None:
                set_(self, key, None if value == "none" else _enum(DomainKind, value, key, ("none",)))
        _check_kind(self)
        _check_ranges(self)
        if self.gpu_ids is not None:
            set_(self, "gpu_ids", tuple(sorted(self.gpu_ids)))
        set_(self, "affinity", tuple(self.affinity))
        set_(self, "anti_affinity", tuple(self.anti_affinity))

    @property
    def kind(self) -> str:
        """`whole`, `share`, `mig` or `cpu` (no device): which placement path serves it."""
        if self.gpus is not None:
            return "whole"
        if self.mig is not None:
            return "mig"
        if self.memory_mib is None and self.compute_pct is None:
            return "cpu"
        return "share"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "claim") -> Claim:
        """Decode the JSON/TOML form; every refusal names `path.field`."""
        return convert(d, cls, root=path, empty=path)

    def to_dict(self) -> dict[str, Any]:
        """The canonical form: defaults left out, enums as their values."""
        out: dict[str, Any] = to_plain(self)
        return out


def _enum(cls: type[Enum], value: Any, key: str, extra: tuple[str, ...]) -> Any:
    try:
        return cls(value)
    except ValueError:
        options = ", ".join([str(m.value) for m in cls] + list(extra))
        raise ValueError(f"{key}: must be one of {options}, got {value!r}") from None


GPU_RULES = ("distinct", "colocate", "exclusive", "pool", "gpu_ids", "allow_busy", "affinity", "anti_affinity",
             "share", "model", "min_memory_mib", "compute_capability", "same")
"""The placement rules that choose among GPUs: a CPU-only claim has none to choose."""


def _check_kind(c: Claim) -> None:
    share = c.memory_mib is not None or c.compute_pct is not None
    given = [name for name, on in (("gpus", c.gpus is not None), ("memory_mib/compute_pct", share),
                                   ("mig", c.mig is not None)) if on]
    if len(given) > 1 or (not given and c.cpus is None):
        problem = "nothing claimed" if not given else f"{' and '.join(given)} do not combine"
        raise ValueError(f": {problem}: give exactly one of gpus, memory_mib and/or compute_pct, or mig "
                         "(or cpus alone, for no device)")
    if not given:
        rules = [k for k in GPU_RULES if getattr(c, k) not in (None, False, ())]
        if rules:
            raise ValueError(f"{rules[0]}: a CPU-only claim (cpus alone) places no GPU: leave it out")


def _check_ranges(c: Claim) -> None:
    """The rules that span fields, and those a claim built in code (not decoded) must also meet."""
    if c.share is not None and c.kind in ("whole", "mig"):
        raise ValueError(f"share: only for a memory/compute claim ({'gpus' if c.kind == 'whole' else 'mig'} "
                         "asks for whole devices)")
    if c.exclusive is DomainKind.MACHINE:
        raise ValueError("exclusive: must be one of nvlink, pcie, numa, none "
                         "(a whole machine is not a domain to hold alone)")
    if c.gpu_ids is not None:
        if len(set(c.gpu_ids)) != len(c.gpu_ids):
            raise ValueError("gpu_ids: a GPU is listed twice")
        if c.gpus is not None and len(c.gpu_ids) < c.gpus:
            raise ValueError(f"gpu_ids: pins {plural(len(c.gpu_ids), 'GPU')} but the claim asks for {c.gpus}")
    if c.cpus is not None and c.cpus < 1:
        raise ValueError(f"cpus: must be at least 1, got {c.cpus} (a claim of no CPUs holds nothing)")


@dataclass(frozen=True)
class AllocatorConfig:
    """The operator's placement settings (the `[placement]` and `[pools]` tables).

    A share asked without `memory_mib` gets `default_share_mib` when set, else
    `default_share_fraction` of the device's memory rounded down: never the
    whole device by accident.
    """

    pools: Mapping[str, frozenset[int]] = field(default_factory=dict)
    default_share_mib: int | None = None
    default_share_fraction: float = 0.25
    default_strategy: Strategy = Strategy.BINPACK
    sharing: SharingRules = field(default_factory=SharingRules)
    """Each GPU's sharing policy (`[sharing]`): shareable at all, and what a share may take."""

    def __post_init__(self) -> None:
        if not 0 < self.default_share_fraction <= 1:
            raise ValueError(f"default_share_fraction must be in (0, 1], got {self.default_share_fraction}")
        if self.default_share_mib is not None and self.default_share_mib < 1:
            raise ValueError(f"default_share_mib must be at least 1, got {self.default_share_mib}")

    def pool_problems(self, gpu_count: int) -> list[str]:
        """Pools and sharing policies naming a GPU this machine lacks: a typo that would make a
        pool quietly smaller, or a policy quietly apply to nothing."""
        has = {0: "it has no GPU", 1: "it has GPU 0"}.get(gpu_count, f"it has GPUs 0-{gpu_count - 1}")
        return [f"pools.{name}: no GPU {index} on this machine ({has})"
                for name, gpus in sorted(self.pools.items()) for index in sorted(gpus) if index >= gpu_count] + [
                f"sharing.gpus.{index}: no GPU {index} on this machine ({has})"
                for index in sorted(self.sharing.gpus) if index >= gpu_count]

    def share_mib(self, device_mib: int) -> int:
        if self.default_share_mib is not None:
            return self.default_share_mib
        return max(1, int(device_mib * self.default_share_fraction))
