"""What a compute group asks for, checked once at the door.

A claim arrives from JSON, TOML or the command line; everything below the API
(the manager, the allocator, the state file) trusts a `Claim` because this
module refused every malformed one with the field named. `to_dict` is the one
canonical form: the state file keeps it and compares claims by it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from computegroups.topology.model import DomainKind

MAX_GPUS = 1024
_UNIT_MIB = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?)?\s*", re.IGNORECASE)
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_LEVELS = ("device",) + tuple(k.value for k in DomainKind)


class ClaimError(ValueError):
    """A claim is malformed; the message starts with the path of the field.

    `where` is relative to the claim so that `Claim.from_dict` can re-root an
    error raised by the dataclass itself under the caller's path.
    """

    def __init__(self, path: str, where: str, problem: str) -> None:
        self.path = path
        self.where = where
        self.problem = problem
        super().__init__(f"{path}{'.' + where if where else ''}: {problem}")

    def under(self, path: str) -> ClaimError:
        return ClaimError(path, self.where, self.problem)


class Strategy(str, Enum):
    BINPACK = "binpack"
    SPREAD = "spread"


@dataclass(frozen=True)
class AffinityTerm:
    """Another component this group should (or should not) sit next to.

    `level` is `device` (the same physical GPU) or a `DomainKind` value (the
    same NVLink island, PCIe switch, NUMA node or machine).
    """

    component: str
    level: str = "device"

    def __post_init__(self) -> None:
        if not isinstance(self.component, str) or not _NAME_RE.fullmatch(self.component):
            raise ClaimError("claim", "component", f"not a component name: {self.component!r}")
        if self.level not in _LEVELS:
            raise ClaimError("claim", "level", f"must be one of {', '.join(_LEVELS)}, got {self.level!r}")

    @property
    def domain_kind(self) -> DomainKind | None:
        return None if self.level == "device" else DomainKind(self.level)

    def to_dict(self) -> dict[str, str]:
        return {"component": self.component, "level": self.level}


@dataclass(frozen=True)
class Claim:
    """One compute group's needs: whole GPUs, a share of one GPU, or a MIG device.

    Direct construction is checked as strictly as `from_dict`, so a claim built
    in code can not carry a combination the allocator was never designed for.
    """

    gpus: int | None = None
    memory_mib: int | None = None
    compute_pct: int | None = None
    mig: str | None = None
    distinct: bool = False
    strategy: Strategy | None = None
    """None: the daemon's configured default (binpack unless configured)."""
    colocate: DomainKind | None = None
    exclusive: DomainKind | None = None
    pool: str | None = None
    gpu_ids: tuple[int, ...] | None = None
    priority: int = 0
    allow_busy: bool = False
    affinity: tuple[AffinityTerm, ...] = ()
    anti_affinity: tuple[AffinityTerm, ...] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.strategy is not None:
            set_(self, "strategy", _enum(Strategy, self.strategy, "strategy"))
        for key in ("colocate", "exclusive"):
            if getattr(self, key) is not None:
                set_(self, key, _enum(DomainKind, getattr(self, key), key))
        _check_kind(self)
        _check_ranges(self)
        if self.gpu_ids is not None:
            set_(self, "gpu_ids", tuple(sorted(self.gpu_ids)))
        set_(self, "affinity", tuple(self.affinity))
        set_(self, "anti_affinity", tuple(self.anti_affinity))

    @property
    def kind(self) -> str:
        """`whole`, `share` or `mig`: which of the three placement paths serves it."""
        if self.gpus is not None:
            return "whole"
        return "mig" if self.mig is not None else "share"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: str = "claim") -> Claim:
        """Parse the JSON/TOML form; every refusal names `path.field`."""
        if not isinstance(d, Mapping):
            raise ClaimError(path, "", "expected an object")
        unknown = sorted(str(k) for k in d if k not in _FIELDS)
        if unknown:
            raise ClaimError(path, unknown[0], f"unknown field (known: {', '.join(_FIELDS)})")
        values = {key: parse(d[key], key) for key, parse in _FIELDS.items() if key in d}
        try:
            return cls(**values)
        except ClaimError as exc:
            raise exc.under(path) from None

    def to_dict(self) -> dict[str, Any]:
        """The canonical form: defaults left out, enums as their values."""
        out: dict[str, Any] = {}
        for key in _FIELDS:
            value = getattr(self, key)
            if value == _DEFAULTS[key]:
                continue
            if isinstance(value, Enum):
                value = value.value
            elif key in ("affinity", "anti_affinity"):
                value = [term.to_dict() for term in value]
            elif key == "gpu_ids":
                value = list(value)
            out[key] = value
        return out


def _enum(cls: type[Enum], value: Any, key: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        options = ", ".join(str(m.value) for m in cls)  # type: ignore[attr-defined]
        raise ClaimError("claim", key, f"must be one of {options}, got {value!r}") from None


def _check_kind(c: Claim) -> None:
    share = c.memory_mib is not None or c.compute_pct is not None
    given = [name for name, on in (("gpus", c.gpus is not None), ("memory_mib/compute_pct", share),
                                   ("mig", c.mig is not None)) if on]
    if len(given) != 1:
        problem = "nothing claimed" if not given else f"{' and '.join(given)} do not combine"
        raise ClaimError("claim", "", f"{problem}: give exactly one of gpus, memory_mib and/or compute_pct, or mig")


def _check_ranges(c: Claim) -> None:
    def fail(where: str, problem: str) -> None:
        raise ClaimError("claim", where, problem)

    for name, lo, hi in (("gpus", 1, MAX_GPUS), ("memory_mib", 1, None), ("compute_pct", 1, 100)):
        value = getattr(c, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            fail(name, f"expected an integer, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            fail(name, f"must be between {lo} and {hi}, got {value}" if hi else f"must be at least {lo}, got {value}")
    if c.mig is not None and (not isinstance(c.mig, str) or not c.mig.strip() or c.mig != c.mig.strip()):
        fail("mig", f"expected a MIG profile name such as '1g.10gb', got {c.mig!r}")
    if c.exclusive is DomainKind.MACHINE:
        fail("exclusive", "must be one of nvlink, pcie, numa (a whole machine is not a domain to hold alone)")
    if c.pool is not None and (not isinstance(c.pool, str) or not c.pool):
        fail("pool", f"expected a pool name, got {c.pool!r}")
    if isinstance(c.priority, bool) or not isinstance(c.priority, int):
        fail("priority", f"expected an integer, got {c.priority!r}")
    if c.gpu_ids is not None:
        if not c.gpu_ids:
            fail("gpu_ids", "expected at least one GPU index")
        if len(set(c.gpu_ids)) != len(c.gpu_ids):
            fail("gpu_ids", "a GPU is listed twice")
        if c.gpus is not None and len(c.gpu_ids) < c.gpus:
            fail("gpu_ids", f"pins {len(c.gpu_ids)} GPUs but gpus asks for {c.gpus}")


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClaimError("claim", key, f"expected an integer, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ClaimError("claim", key, f"expected true or false, got {value!r}")
    return value


def _memory(value: Any, key: str) -> int:
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ClaimError("claim", key, str(exc)) from None
    return _int(value, key)


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ClaimError("claim", key, f"expected a string, got {value!r}")
    return value


def _choice(options: tuple[str, ...]):
    def parse(value: Any, key: str) -> str | None:
        if value not in options:
            raise ClaimError("claim", key, f"must be one of {', '.join(options)}, got {value!r}")
        return None if value == "none" else value

    return parse


def _gpu_ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ClaimError("claim", key, f"expected a list of GPU indices, got {value!r}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ClaimError("claim", f"{key}[{i}]", f"expected a GPU index (integer >= 0), got {item!r}")
    return tuple(value)


def _terms(value: Any, key: str) -> tuple[AffinityTerm, ...]:
    if not isinstance(value, (list, tuple)):
        raise ClaimError("claim", key, "expected a list of {component, level} objects")
    terms = []
    for i, item in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ClaimError("claim", where, "expected an object with component and level")
        extra = sorted(str(k) for k in item if k not in ("component", "level"))
        if extra:
            raise ClaimError("claim", f"{where}.{extra[0]}", "unknown field (known: component, level)")
        if "component" not in item:
            raise ClaimError("claim", f"{where}.component", "required")
        try:
            terms.append(AffinityTerm(item["component"], item.get("level", "device")))
        except ClaimError as exc:
            raise ClaimError("claim", f"{where}.{exc.where}", exc.problem) from None
    return tuple(terms)


_DOMAINS = tuple(k.value for k in DomainKind)
_FIELDS = {
    "gpus": _int,
    "memory_mib": _memory,
    "compute_pct": _int,
    "mig": _text,
    "distinct": _bool,
    "strategy": _choice(tuple(s.value for s in Strategy)),
    "colocate": _choice(_DOMAINS + ("none",)),
    "exclusive": _choice(tuple(d for d in _DOMAINS if d != "machine") + ("none",)),
    "pool": _text,
    "gpu_ids": _gpu_ids,
    "priority": _int,
    "allow_busy": _bool,
    "affinity": _terms,
    "anti_affinity": _terms,
}
_DEFAULTS = {f.name: f.default for f in Claim.__dataclass_fields__.values()}  # type: ignore[attr-defined]


def parse_size(text: str | int) -> int:
    """A memory size in MiB.

    A bare number is MiB. Units are binary whatever their spelling: `20G`,
    `20GB` and `20GiB` are all 20480 MiB, because GPU memory is sold in
    "GB" that are GiB and nobody means 10^9 bytes when sizing a share.
    Fractions round up to the next MiB so a share is never smaller than asked.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        mib = text
    else:
        match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"not a size: {text!r} (use a number of MiB or units MiB/GiB/TiB, e.g. '20GiB')")
        mib = math.ceil(float(match.group(1)) * _UNIT_MIB[(match.group(2) or "").lower()])
    if mib < 1:
        raise ValueError(f"a size must be at least 1 MiB, got {text!r}")
    return mib


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

    def __post_init__(self) -> None:
        if not 0 < self.default_share_fraction <= 1:
            raise ValueError(f"default_share_fraction must be in (0, 1], got {self.default_share_fraction}")
        if self.default_share_mib is not None and self.default_share_mib < 1:
            raise ValueError(f"default_share_mib must be at least 1, got {self.default_share_mib}")

    def share_mib(self, device_mib: int) -> int:
        if self.default_share_mib is not None:
            return self.default_share_mib
        return max(1, int(device_mib * self.default_share_fraction))
