"""What Ray users do instead: logical GPUs (`ray.init(num_gpus=8)`) and actors
with fractional or whole `num_gpus`, placed beside the same claims on cgd.

Ray is an optional extra (`pip install 'computegroups[bench]'`); without it
this section says so and the rest of the run goes on. It measures:

- a cycle: create an actor (or a component), wait until its process answers,
  kill it (release it); both workers are Python processes that report
  their CUDA_VISIBLE_DEVICES;
- placement: half-GPU requests, then whole GPUs. Fractions are bookkeeping
  in Ray: where it spreads them, whole GPUs no longer fit. cgd packs shares
  (memory and compute) and places whole GPUs on what is left.

    python -m benchmarks.raybench [--quick]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from benchmarks.baselines import GPU_MIB, GPUS
from benchmarks.harness import ok, running_cgd, wait_for
from benchmarks.report import Table, ms, percentile, ratio, run_standalone, skipped
from tests.daemon_fixture import Cgd

TITLE = "Ray with logical GPUs"
MISSING = "Ray is not installed (pip install 'computegroups[bench]')"
READY_TIMEOUT_S = 10.0
"""Far beyond an actor's start here (about 0.5 s): one not running by then waits for capacity."""
# The cgd worker reports like the Ray actor does: its CUDA_VISIBLE_DEVICES, once its interpreter runs.
REPORTER = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', ''))\n" \
           "import time; time.sleep(86400)"
SCENARIO = ((0.5, 8), (1.0, 4))
"""(GPU fraction, how many): eight half GPUs, then four whole ones. Packed,
the halves take four GPUs and all twelve fit on eight."""


def run(quick: bool = False) -> list[Table]:
    try:
        import ray
    except ImportError:
        return [skipped(TITLE, MISSING)]
    reps, runs = (5, 2) if quick else (20, 5)
    ray.init(num_gpus=GPUS, num_cpus=GPUS, include_dashboard=False, log_to_driver=False,
             object_store_memory=80 * 1024 * 1024, configure_logging=False)
    try:
        probe = ray.remote(num_cpus=0)(Probe)
        ray_cycle = [_ray_cycle(ray, probe) for _ in range(reps + 1)][1:]
        ray_placed = [_ray_scenario(ray, probe) for _ in range(runs)]
    finally:
        ray.shutdown()
    with running_cgd() as cgd:
        cgd_cycle = [_cgd_cycle(cgd, n) for n in range(reps + 1)][1:]
        cgd_placed = [_cgd_scenario(cgd) for _ in range(runs)]
    cycle = Table(f"{TITLE}: start a worker on a quarter GPU, wait for it to answer, end it",
                  ["system", "samples", "p50 ms", "p99 ms", "time vs Ray"])
    cycle.add("cgd", reps, ms(percentile(cgd_cycle, 50)), ms(percentile(cgd_cycle, 99)),
              ratio(percentile(cgd_cycle, 50), percentile(ray_cycle, 50)))
    cycle.add(f"Ray {ray.__version__}", reps, ms(percentile(ray_cycle, 50)), ms(percentile(ray_cycle, 99)), "1.00x")
    cycle.note("Ray: an actor with num_gpus=0.25 answering one method call, then ray.kill; cgd: a component "
               "with a 20 GiB / 25% share whose Python worker writes its CUDA_VISIBLE_DEVICES, then release.")
    wanted = sum(n for _, n in SCENARIO)
    scenario = " then ".join(f"{n} x {f:g} GPU" for f, n in SCENARIO)
    placed = Table(f"{TITLE}: {scenario} on {GPUS} GPUs, {runs} runs",
                   ["system", "runs with all placed", "fewest placed", "most GPUs holding the fractions"])
    for system, results in (("cgd", cgd_placed), (f"Ray {ray.__version__}", ray_placed)):
        placed.add(system, f"{sum(1 for count, _ in results if count == wanted)} of {runs}",
                   f"{min(count for count, _ in results)} of {wanted}", max(gpus for _, gpus in results))
    placed.note("Packed, the halves take 4 GPUs and the 4 whole GPUs fit beside them; spread over more, a "
                f"whole GPU waits for capacity. An actor not running {READY_TIMEOUT_S:g} s after its batch "
                "was created counts as not placed.")
    return [cycle, placed]


class Probe:
    """The Ray actor: its answer proves the process runs, and shows what it was given."""

    def visible(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def _ray_cycle(ray: Any, probe: Any) -> float:
    begin = time.perf_counter()
    actor = probe.options(num_gpus=0.25).remote()
    ray.get(actor.visible.remote(), timeout=READY_TIMEOUT_S)
    ray.kill(actor)
    return time.perf_counter() - begin


def _ray_scenario(ray: Any, probe: Any) -> tuple[int, int]:
    """(actors placed, GPUs the fractional ones sit on); every actor is killed afterwards."""
    actors: list[Any] = []
    placed, fraction_gpus = 0, set[str]()
    for fraction, count in SCENARIO:
        batch = [probe.options(num_gpus=fraction).remote() for _ in range(count)]
        actors.extend(batch)
        calls = [a.visible.remote() for a in batch]
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=READY_TIMEOUT_S)
        for visible in ray.get(ready):
            placed += 1
            if fraction < 1:
                fraction_gpus.update(visible.split(","))
    for actor in actors:
        ray.kill(actor)
    return placed, len(fraction_gpus)


def _share(fraction: float) -> dict[str, int]:
    return {"memory_mib": int(GPU_MIB * fraction), "compute_pct": int(100 * fraction)}


def _cgd_cycle(cgd: Cgd, n: int) -> float:
    report = cgd.root / f"cycle-{n}"
    begin = time.perf_counter()
    ok(cgd, "POST", "/v1/components", {"name": f"cycle-{n}", "claim": _share(0.25),
                                        "command": [sys.executable, "-c", REPORTER, str(report)]}, expect=201)
    wait_for(lambda: report.exists(), timeout=READY_TIMEOUT_S)
    ok(cgd, "DELETE", f"/v1/components/cycle-{n}")
    return time.perf_counter() - begin


def _cgd_scenario(cgd: Cgd) -> tuple[int, int]:
    placed, fraction_gpus = 0, set[int]()
    for fraction, count in SCENARIO:
        for n in range(count):
            claim = {"gpus": 1} if fraction >= 1 else _share(fraction)
            name = f"s{fraction:g}-{n}".replace(".", "p")
            status, reply = cgd.request("POST", "/v1/components", {"name": name, "claim": claim})
            if status != 201:
                continue
            placed += 1
            if fraction < 1:
                fraction_gpus.update(d["index"] for d in reply["replicas"][0]["devices"])
    ok(cgd, "DELETE", "/v1/components?all=true")
    return placed, len(fraction_gpus)


def main() -> None:
    run_standalone(__doc__, run)


if __name__ == "__main__":
    main()
