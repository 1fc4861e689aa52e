"""A claim's ways to be served, tried in order before any search: DRA's request rules.

Three rules turn one claim into the plain claims the allocator places, each
narrowing or rounding what it asks, never widening it:

- `share`: `whole` asks for a whole GPU with at least the claim's memory,
  `any` tries a share first and a whole GPU after, `share` (or none) a share;
- sharing policies (`AllocatorConfig.sharing`): a share goes only to a
  shareable GPU, and asks the smallest valid amount at or above what it
  asked (the policy's default when it asked none), as the Kubernetes
  scheduler rounds a consumable-capacity request; a request past every
  policy is refused with the policies in the message;
- `same`: every device of the request has one value of the attribute
  (DRA's matchAttribute), so each value is tried in turn.

`place` tries them in order and answers the first that fits. Pure, like
the allocator: the core and the queue call it with their allocator.
"""

from __future__ import annotations

import dataclasses
import glob
from collections.abc import Callable, Mapping, Sequence

from msgspec.structs import replace

from computegroups.daemon.model.claims import Claim, ShareMode
from computegroups.daemon.model.sharepolicy import GpuSharing, SharingRules
from computegroups.daemon.model.words import plural
from computegroups.daemon.placement.allocator import Allocator
from computegroups.daemon.placement.records import DoesNotFitNow, NeverFits, Placement, PlacementError
from computegroups.daemon.placement.selectors import selected
from computegroups.topology.model import Machine


def place(allocator: Allocator, claim: Claim, group_ids: Sequence[str], owner: str, *,
          reserved: bool = False) -> tuple[Placement, ...]:
    """Place the groups by the first of the claim's alternatives that fits, all or nothing."""
    failures: list[PlacementError] = []
    for variant, note in alternatives(allocator.machine, allocator.config.sharing, claim,
                                      allocator.config.share_mib, allocator.config.pools):
        try:
            placements = allocator.allocate(variant, group_ids, owner, reserved=reserved)
        except PlacementError as exc:
            failures.append(exc)
            continue
        if note:
            placements = tuple(dataclasses.replace(p, score=dataclasses.replace(
                p.score, explanation=f"{p.score.explanation}; {note}" if p.score.explanation else note))
                for p in placements)
        return placements
    assert failures, "a claim has at least one alternative"
    now = [f for f in failures if isinstance(f, DoesNotFitNow)]
    models = _models(allocator.machine, claim, allocator.config.pools) if claim.same is not None else {}
    if len(models) > 1:  # each model refused it: say what every one has, not only the first
        ledger = allocator.ledger
        have = "; ".join(
            f"{name}: {plural(len(gpus), 'GPU')}, "
            f"{sum(not ledger.groups_on[g] and g not in ledger.unavailable for g in gpus)} free"
            for name, gpus in models.items())
        if now:
            raise DoesNotFitNow(f"same model: no one model has room for it now ({have})")
        raise NeverFits(f"same model: no one model can ever hold it ({have})")
    raise now[0] if now else failures[0]


def alternatives(machine: Machine, sharing: SharingRules, claim: Claim,
                 share_mib: Callable[[int], int] | None = None,
                 pools: Mapping[str, frozenset[int]] | None = None) -> list[tuple[Claim, str]]:
    """The plain claims to try, in order, each with a note for its explanation ("" for none).

    Raises NeverFits when the policies leave no way at all.
    """
    out: list[tuple[Claim, str]] = []
    refusals: list[str] = []
    if claim.kind == "share" and claim.share is not ShareMode.WHOLE:
        out, refusals = _policy_shares(machine, sharing, claim, share_mib, pools or {})
    elif claim.kind != "share":
        out.append((claim, ""))
    if claim.share in (ShareMode.WHOLE, ShareMode.ANY):
        out.append((_whole(claim), f"a whole GPU (share = {claim.share})"))
    if not out:
        raise NeverFits("; ".join(refusals))
    if claim.same is None:
        return out
    return [(pinned, note) for variant, note in out for pinned in _same(machine, variant, pools or {})]


def _whole(claim: Claim) -> Claim:
    """The claim as one whole GPU with at least its memory ("all of the device")."""
    floor = max(claim.memory_mib or 0, claim.min_memory_mib or 0) or None
    return replace(claim, gpus=1, memory_mib=None, compute_pct=None, share=None, min_memory_mib=floor)


def _policy_shares(machine: Machine, sharing: SharingRules, claim: Claim, share_mib: Callable[[int], int] | None,
                   pools: Mapping[str, frozenset[int]]) -> tuple[list[tuple[Claim, str]], list[str]]:
    """The share, once per distinct policy of the GPUs it may use, asked as that policy rounds it."""
    scope = _scope(machine, claim, pools)
    if not scope:  # nothing to round for: the allocator says why no GPU may serve it
        return [(replace(claim, share=None), "")], []
    by_policy: dict[GpuSharing, list[int]] = {}
    for g in scope:
        by_policy.setdefault(sharing.of(g), []).append(g)
    whole_scope = len(by_policy) == 1  # one policy for all it may use: no pin needed
    out: list[tuple[Claim, str]] = []
    refused: list[str] = []
    for policy, gpus in by_policy.items():
        where = _gpus_text(gpus)
        if not policy.shareable:
            refused.append(f"{where} {'is' if len(gpus) == 1 else 'are'} not shareable (sharing policy)")
            continue
        if not policy.constrained:
            variant = claim
        else:
            smallest = min((machine.gpu(g).memory_mib or 0) for g in gpus)
            want = claim.memory_mib or policy.memory.default or (share_mib(smallest) if share_mib else None)
            memory = policy.memory.round_up(want) if want is not None else None
            want_c = claim.compute_pct or policy.compute.default
            compute = policy.compute.round_up(want_c) if want_c else None
            if want is not None and memory is None:
                refused.append(f"memory {policy.memory.text(want)} is outside the sharing policy of {where} "
                               f"(memory {policy.memory.describe()})")
                continue
            if want_c and compute is None:
                refused.append(f"compute {want_c}% is outside the sharing policy of {where} "
                               f"(compute {policy.compute.describe()})")
                continue
            variant = replace(claim, memory_mib=memory, compute_pct=compute)
            notes = [f"{name} {rule.text(asked)} rounded up to {rule.text(got)}"
                     for name, rule, asked, got in (("memory", policy.memory, want, memory),
                                                    ("compute", policy.compute, want_c, compute))
                     if asked is not None and got is not None and asked != got]
            out.append((variant if whole_scope else replace(variant, gpu_ids=tuple(gpus)),
                        f"{', '.join(notes)} by the sharing policy of {where}" if notes else ""))
            continue
        out.append((variant if whole_scope else replace(variant, gpu_ids=tuple(gpus)), ""))
    return [(replace(c, share=None), note) for c, note in out], refused


def _same(machine: Machine, claim: Claim, pools: Mapping[str, frozenset[int]]) -> list[Claim]:
    """One claim per model among the GPUs it may use, each pinned to that model."""
    models = _models(machine, claim, pools)
    return [replace(claim, model=glob.escape(name), same=None) for name in models] or [replace(claim, same=None)]


def _models(machine: Machine, claim: Claim, pools: Mapping[str, frozenset[int]]) -> dict[str, list[int]]:
    """The GPUs the claim may use, by model, in the order they first appear."""
    models: dict[str, list[int]] = {}
    for g in _scope(machine, claim, pools):
        models.setdefault(machine.gpu(g).name, []).append(g)
    return models


def _scope(machine: Machine, claim: Claim, pools: Mapping[str, frozenset[int]]) -> list[int]:
    """The GPUs the claim may use by its pool, pins and selectors (an unknown pool: the allocator says so)."""
    gpus = set(machine.indices)
    if claim.pool is not None and claim.pool in pools:
        gpus &= pools[claim.pool]
    if claim.gpu_ids is not None:
        gpus &= set(claim.gpu_ids)
    chosen = selected(machine, claim)
    if chosen is not None:
        gpus &= chosen
    return sorted(gpus)


def _gpus_text(gpus: list[int]) -> str:
    return f"GPU {gpus[0]}" if len(gpus) == 1 else "GPUs " + ",".join(map(str, gpus))
