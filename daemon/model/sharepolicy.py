"""Per-GPU sharing policies: DRA's consumable capacity with its request policy, in cgd's config.

A device that is shared publishes, for each capacity (`memory`, `compute`),
what a request may take: a default for a request that names none, and the
valid amounts, as a range (`min`, `max`, `step`) or a list of values. A
request is rounded up to the next valid amount, as the Kubernetes scheduler
does with a `requestPolicy` (KEP-5075), and that rounded amount is what the
share consumes; a request past every valid amount cannot be served by that
device. The `[sharing]` table of the configuration declares the policy for
every GPU, and `[sharing.gpus.N]` overrides it for GPU N.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from computegroups.daemon.model.sizes import parse_size

Amount = Annotated[int, Meta(ge=1)] | str
"""Memory as MiB or a size ("4GiB"); compute as a percentage of the SMs."""


class _Table(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A table of the configuration: a misspelt key stops cgd rather than doing nothing."""


class ValidRange(_Table, frozen=True, kw_only=True):
    min: Amount
    max: Amount | None = None
    step: Amount | None = None


class CapacityPolicy(_Table, frozen=True, kw_only=True):
    """One capacity's request policy; amounts are MiB (memory) or percent (compute) once read."""

    default: Amount | None = None
    valid_range: ValidRange | None = None
    valid_values: Annotated[tuple[Amount, ...], Meta(min_length=1)] | None = None

    def amounts(self, memory: bool) -> CapacityRule:
        """The rule with every amount as a number: sizes read for memory, 1-100 checked for compute."""
        read = _mib if memory else _pct
        if self.valid_range is not None and self.valid_values is not None:
            raise ValueError("give valid_range or valid_values, not both")
        low = high = step = None
        if self.valid_range is not None:
            low = read(self.valid_range.min, "valid_range.min")
            high = read(self.valid_range.max, "valid_range.max") if self.valid_range.max is not None else None
            step = read(self.valid_range.step, "valid_range.step") if self.valid_range.step is not None else None
            if high is not None and high < low:
                shown = CapacityRule(memory=memory).text
                raise ValueError(f"valid_range: max {shown(high)} is below min {shown(low)}")
        values = tuple(sorted({read(v, "valid_values") for v in self.valid_values})) if self.valid_values else None
        rule = CapacityRule(memory=memory, low=low, high=high, step=step, values=values, default=None)
        if self.default is not None:
            default = read(self.default, "default")
            if rule.round_up(default) != default:
                raise ValueError(f"default: {rule.text(default)} is not a valid amount ({rule.describe()})")
            rule = msgspec.structs.replace(rule, default=default)
        return rule


class CapacityRule(msgspec.Struct, frozen=True, kw_only=True):
    """A capacity policy read into numbers, with the rounding DRA applies."""

    memory: bool
    low: int | None = None
    high: int | None = None
    step: int | None = None
    values: tuple[int, ...] | None = None
    default: int | None = None

    def round_up(self, want: int) -> int | None:
        """The smallest valid amount >= want; None when there is none (outside the policy).

        >>> CapacityRule(memory=True, low=1024, high=8192, step=1024).round_up(1500)
        2048
        >>> CapacityRule(memory=False, values=(10, 25, 50)).round_up(30), CapacityRule(memory=False,
        ...     values=(10, 25, 50)).round_up(60)
        (50, None)
        """
        if self.values is not None:
            return next((v for v in self.values if v >= want), None)
        if self.low is None:
            return want
        got = self.low if want <= self.low else self.low + math.ceil((want - self.low) / (self.step or 1)) * (
            self.step or 1)
        return got if self.high is None or got <= self.high else None

    def text(self, amount: int) -> str:
        if not self.memory:
            return f"{amount}%"
        return f"{amount // 1024}GiB" if amount % 1024 == 0 else f"{amount}MiB"

    def describe(self) -> str:
        """The policy in the words of the configuration, for refusals."""
        if self.values is not None:
            return "valid_values " + ", ".join(self.text(v) for v in self.values)
        if self.low is None:
            return "any amount"
        parts = [f"min {self.text(self.low)}"]
        if self.high is not None:
            parts.append(f"max {self.text(self.high)}")
        if self.step is not None:
            parts.append(f"step {self.text(self.step)}")
        return "valid_range " + " ".join(parts)


class SharePolicy(_Table, frozen=True, kw_only=True):
    """One GPU's policy as written; an unset key (None) takes the `[sharing]` default."""

    shareable: bool | None = None
    memory: CapacityPolicy | None = None
    compute: CapacityPolicy | None = None


class SharingTable(SharePolicy, frozen=True, kw_only=True):
    """The `[sharing]` table: the policy of every GPU, and per-GPU overrides (`gpus.N`)."""

    gpus: dict[str, SharePolicy] = {}

    def rules(self) -> SharingRules:
        """Read once at start-up: raises ValueError naming the key of the first mistake."""
        default = _rule_of(self, "sharing")
        per_gpu: dict[int, GpuSharing] = {}
        for key, policy in self.gpus.items():
            if not key.isdigit():
                raise ValueError(f"sharing.gpus.{key}: expected a GPU index")
            mine = _rule_of(policy, f"sharing.gpus.{key}")
            per_gpu[int(key)] = GpuSharing(
                shareable=policy.shareable if policy.shareable is not None else default.shareable,
                memory=mine.memory if policy.memory is not None else default.memory,
                compute=mine.compute if policy.compute is not None else default.compute,
            )
        return SharingRules(default=default, gpus=per_gpu)


class GpuSharing(msgspec.Struct, frozen=True, kw_only=True):
    """What one GPU lets a share take."""

    shareable: bool = True
    memory: CapacityRule = CapacityRule(memory=True)
    compute: CapacityRule = CapacityRule(memory=False)

    @property
    def constrained(self) -> bool:
        return not self.shareable or self.memory != CapacityRule(memory=True) or \
            self.compute != CapacityRule(memory=False)

    def describe(self) -> str:
        if not self.shareable:
            return "not shareable"
        return f"memory {self.memory.describe()}; compute {self.compute.describe()}"


class SharingRules(msgspec.Struct, frozen=True, kw_only=True):
    """Every GPU's sharing policy: the default, and the GPUs that differ from it."""

    default: GpuSharing = GpuSharing()
    gpus: dict[int, GpuSharing] = {}

    def of(self, gpu: int) -> GpuSharing:
        return self.gpus.get(gpu, self.default)


def _rule_of(policy: SharePolicy, where: str) -> GpuSharing:
    out: dict[str, Any] = {"shareable": policy.shareable if policy.shareable is not None else True}
    for name in ("memory", "compute"):
        capacity = getattr(policy, name)
        if capacity is None:
            continue
        try:
            out[name] = capacity.amounts(memory=name == "memory")
        except ValueError as exc:
            raise ValueError(f"{where}.{name}: {exc}") from None
    return GpuSharing(**out)


def _mib(value: int | str, key: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _pct(value: int | str, key: str) -> int:
    if isinstance(value, str) or not 1 <= value <= 100:
        raise ValueError(f"{key}: expected a percentage of the SMs, 1-100, got {value!r}")
    return value
