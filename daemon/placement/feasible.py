"""Claims that can never fit on this machine, whatever is in use.

These are told apart from "not now" because the answer to them is different:
change the claim (or the machine), not wait. Everything here looks at the
machine and the configuration only.
"""

from __future__ import annotations

from computegroups.daemon.model.claims import AllocatorConfig, Claim
from computegroups.daemon.model.words import plural
from computegroups.daemon.placement.explain import colocated, domain_name, gpus_phrase, memory_text
from computegroups.daemon.placement.records import NeverFits
from computegroups.daemon.placement.selectors import gpu_kinds, has_selectors, model_hint, selected, selector_text
from computegroups.daemon.placement.shares import may_use_mig
from computegroups.daemon.placement.topo import Topo
from computegroups.topology.model import DomainKind


def check_ever(topo: Topo, config: AllocatorConfig, claim: Claim, groups: int) -> None:
    if not topo.gpus:
        raise NeverFits("this machine has no GPU: claim cpus alone for a CPU-only group "
                        "(or give only a command)")
    gpus = _scope(topo, config, claim)
    where = _where(claim)
    if claim.kind == "whole":
        _whole(topo, claim, [g for g in gpus if not topo.mig[g]], groups, where)
    elif claim.kind == "mig":
        _mig(topo, claim, gpus, groups, where)
    else:
        _share(topo, config, claim, gpus, groups, where)


def _scope(topo: Topo, config: AllocatorConfig, claim: Claim) -> list[int]:
    gpus = set(topo.gpus)
    if claim.pool is not None:
        if claim.pool not in config.pools:
            known = ", ".join(sorted(config.pools)) or "none configured"
            raise NeverFits(f"unknown pool {claim.pool!r} (pools: {known})")
        gpus &= config.pools[claim.pool]
    if claim.gpu_ids is not None:
        missing = sorted(set(claim.gpu_ids) - set(topo.gpus))
        if missing:
            raise NeverFits(f"gpu_ids names {gpus_phrase(missing)}, not on this machine ({gpus_phrase(topo.gpus)})")
        gpus &= set(claim.gpu_ids)
    chosen = selected(topo.machine, claim)
    if chosen is not None:
        if not chosen:
            raise NeverFits(f"no GPU of this machine has {selector_text(claim)} (it has {gpu_kinds(topo.machine)})"
                            + model_hint(topo.machine, claim))
        gpus &= chosen
    return sorted(gpus)


def _where(claim: Claim) -> str:
    parts = []
    if claim.pool is not None:
        parts.append(f"pool {claim.pool!r}")
    if claim.gpu_ids is not None:
        parts.append(f"gpu_ids {','.join(map(str, claim.gpu_ids))}")
    if has_selectors(claim):
        parts.append(f"the GPUs with {selector_text(claim)}")
    return " and ".join(parts) or "this machine"


def _has(where: str) -> str:
    """`where` with its verb: "this machine has", "the GPUs with model 'X' have"."""
    return f"{where} {'have' if where.startswith('the ') or ' and ' in where else 'has'}"


def _whole(topo: Topo, claim: Claim, gpus: list[int], groups: int, where: str) -> None:
    n = claim.gpus or 1
    mig = [g for g in topo.gpus if topo.mig[g]]
    note = f" ({gpus_phrase(mig)} have MIG enabled and take only mig claims)" if mig else ""
    if n * groups > len(gpus):
        total = f"{groups} groups of {plural(n, 'GPU')}" if groups > 1 else plural(n, "GPU")
        raise NeverFits(f"needs {total}; {_has(where)} {plural(len(gpus), 'GPU')} for whole claims{note}")
    for kind, label in ((claim.colocate, colocated), (claim.exclusive, _exclusively)):
        if kind is None:
            continue
        sizes = sorted((len(dom & set(gpus)) for dom in topo.domains[kind]), reverse=True)
        if not sizes or sizes[0] < n:
            raise NeverFits(f"needs {plural(n, label(kind) + ' GPU')}; the largest {domain_name(kind)} of {where} "
                            f"has {sizes[0] if sizes else 0}")
        if kind is claim.exclusive and sum(size >= n for size in sizes) < groups:
            raise NeverFits(f"needs {groups} {domain_name(kind, True)} of {plural(n, 'GPU')}, one per group; "
                            f"{_has(where)} {sum(size >= n for size in sizes)}")
    if claim.colocate is not None and claim.exclusive is not None:
        _contradiction(topo, claim.exclusive, claim.colocate, n, set(gpus), groups, where)


def _contradiction(topo: Topo, exclusive: DomainKind, colocate: DomainKind, n: int, gpus: set[int],
                   groups: int, where: str) -> None:
    """`exclusive` and `colocate` each fit, but no domain of one meets a domain of the other in n GPUs."""
    meets = [max((len(x & c & gpus) for c in topo.domains[colocate]), default=0) for x in topo.domains[exclusive]]
    if sum(m >= n for m in meets) >= groups:
        return
    most = max(meets, default=0)
    raise NeverFits(
        f"exclusive {exclusive.value} and colocate {colocate.value} contradict on {where}: "
        f"needs {plural(n, 'GPU')} in one {domain_name(exclusive)} and one {domain_name(colocate)}"
        + (f" ({groups} such {domain_name(exclusive, True)})" if groups > 1 else "")
        + f"; the most any {domain_name(exclusive)} and {domain_name(colocate)} share is {most}")


def _exclusively(kind: DomainKind) -> str:
    return f"exclusive-{domain_name(kind)}"


def _mig(topo: Topo, claim: Claim, gpus: list[int], groups: int, where: str) -> None:
    parents = [g for g in gpus if topo.mig[g]]
    devices = [m for g in parents for m in topo.machine.gpu(g).mig_devices]
    matching = [m for m in devices if m.profile == claim.mig]
    if not matching:
        known = ", ".join(sorted({m.profile for m in devices})) or "none"
        raise NeverFits(f"unknown MIG profile {claim.mig!r} on {where} (profiles: {known})")
    distinct = len({m.parent_index for m in matching})
    if groups > len(matching) or (claim.distinct and groups > distinct):
        have = distinct if claim.distinct else len(matching)
        on = " on distinct GPUs" if claim.distinct else ""
        raise NeverFits(f"needs {plural(groups, f'{claim.mig} instance')}{on}; "
                        f"{_has(where)} {have}")


def _share(topo: Topo, config: AllocatorConfig, claim: Claim, gpus: list[int], groups: int, where: str) -> None:
    plain = [g for g in gpus if not topo.mig[g] and topo.memory[g] > 0]
    fits = [g for g in plain if _share_fits(topo, config, claim, g)]
    migs = []
    if may_use_mig(claim):
        migs = [m for g in gpus if topo.mig[g] for m in topo.machine.gpu(g).mig_devices
                if (m.memory_mib or 0) >= (claim.memory_mib or 0)]
    if not fits and not migs:
        if not plain:
            raise NeverFits(f"no GPU of {where} takes shares (MIG enabled or memory unknown); ask for a mig profile")
        largest = max(topo.memory[g] for g in plain)
        raise NeverFits(f"needs {memory_text(claim.memory_mib or 0)} on one GPU; the largest GPU of {where} "
                        f"has {memory_text(largest)}")
    devices = len(set(fits) | {m.parent_index for m in migs})
    if claim.distinct and groups > devices:
        raise NeverFits(f"needs {groups} shares on distinct GPUs; {_has(where)} {plural(devices, 'GPU')} "
                        f"that can take one")
    if claim.exclusive is not None:
        doms = {topo.domain_of(claim.exclusive, g) for g in fits}
        doms.discard(None)
        if groups > len(doms):
            raise NeverFits(f"needs {groups} {domain_name(claim.exclusive, True)} to hold exclusively, "
                            f"one per group; {_has(where)} {len(doms)}")


def _share_fits(topo: Topo, config: AllocatorConfig, claim: Claim, g: int) -> bool:
    memory = claim.memory_mib if claim.memory_mib is not None else config.share_mib(topo.memory[g])
    return memory <= topo.memory[g]
