"""CPUs as a counted capacity: a claim's `cpus` never oversubscribe the machine's.

Counted, not pinned: which CPUs a worker runs on is its NUMA binding's
business (cpu_bind); this only makes sure that the CPUs claimed on the
machine add up to no more than it has, as Slurm counts `--cpus-per-task`.
"""

from __future__ import annotations

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.words import plural
from computegroups.daemon.placement.ledger import Ledger
from computegroups.daemon.placement.records import DoesNotFitNow, NeverFits, Placement, Score


def check_cpus(ledger: Ledger, claim: Claim, groups: int) -> None:
    """Raise when `groups` groups of `claim`'s CPUs would not fit, ever or now."""
    want = (claim.cpus or 0) * groups
    if not want:
        return
    total = len(ledger.machine.cpus)
    asked = plural(want, "CPU") + (f" ({groups} groups of {claim.cpus})" if groups > 1 else "")
    if want > total:
        raise NeverFits(f"needs {asked}; this machine has {total}")
    free = total - ledger.cpus_used
    if want > free:
        raise DoesNotFitNow(f"needs {asked}; {free} of the machine's {total} are not claimed")


def cpu_placement(claim: Claim, gid: str) -> Placement:
    """The placement of a CPU-only claim: no device, only its count."""
    what = plural(claim.cpus or 0, "CPU")
    return Placement(group_id=gid, devices=(), domain=None, exclusive_domain=None,
                     score=Score(nvlinks=0, pcie=0, explanation=f"CPU-only: no GPU, {what}"))
