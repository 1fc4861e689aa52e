"""Workers run on the CPUs local to their GPUs (NVML's CPU affinity), as Slurm's --cpu-bind does.

`cpu_bind = "numa"` (the default on a machine of more than one NUMA node)
binds a worker to the CPUs of its GPUs' NUMA nodes, their union when its
devices span nodes; `none` leaves it free. The binding is shown by `cgctl
list` and `cgctl env` (CG_CPUS), and applied only where its CPUs exist on
this host: a simulated machine's CPUs may not, and then cgd says so once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from computegroups.daemon.client import ComputeGroupManager, LocalComputeResourceProvider
from computegroups.topology.ranges import format_ranges
from tests.daemon.core.test_dra_policies_e2e import MIXED
from tests.daemon.core.test_groups_e2e import ok
from tests.daemon.deployments.test_deployments_e2e import proc_env
from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow
CMD = ("--", sys.executable, "-c", "import time\nwhile True: time.sleep(3600)")
HOST = sorted(os.sched_getaffinity(0))


def worker(cgd: Cgd, name: str) -> tuple[dict, int]:
    _, comp = cgd.request("GET", f"/v1/components/{name}")
    replica = comp["replicas"][0]
    return replica, replica["pids"][0]


def listed_cpus(cgd: Cgd, name: str) -> str:
    lines = ok(cgd, "list").splitlines()
    column = lines[0].split().index("CPUS")
    return next(line.split()[column] for line in lines if line.split()[0] == name)


@pytest.mark.skipif(len(HOST) < 2, reason="needs two CPUs to bind to one of them")
def test_workers_are_bound_to_their_gpus_numa_cpus(start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    low, high = HOST[0], HOST[-1]
    machine = tmp_path / "two-nodes.toml"  # the mixed pairs, each NUMA node one CPU of this host
    machine.write_text(MIXED.read_text().replace('cpus = "0-7"', f'cpus = "{low}"')
                       .replace('cpus = "8-15"', f'cpus = "{high}"'))
    cgd = start_cgd(str(machine))
    ok(cgd, "allocate", "near", "--gpus", "1", "--gpu-ids", "0", *CMD)
    replica, pid = worker(cgd, "near")
    assert replica["cpu_binding"] == str(low)
    assert proc_env(pid)["CG_CPUS"] == str(low)
    assert psutil.Process(pid).cpu_affinity() == [low], "applied: the worker runs on its GPU's node"
    assert listed_cpus(cgd, "near") == str(low)
    assert f"export CG_CPUS={low}" in ok(cgd, "env", "near")

    ok(cgd, "allocate", "span", "--gpus", "2", "--gpu-ids", "1,2", *CMD)
    replica, pid = worker(cgd, "span")
    assert psutil.Process(pid).cpu_affinity() == [low, high], "a group spanning nodes gets the union"
    assert proc_env(pid)["CG_CPUS"] == replica["cpu_binding"] == format_ranges([low, high])

    ok(cgd, "allocate", "free", "--gpus", "1", "--gpu-ids", "3", "--cpu-bind", "none", *CMD)
    replica, pid = worker(cgd, "free")
    assert replica["cpu_binding"] is None and "CG_CPUS" not in proc_env(pid)
    assert psutil.Process(pid).cpu_affinity() == HOST and listed_cpus(cgd, "free") == "-"

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        await m.allocate_compute_group("cpu", {"cpus": 1}, {"command": list(CMD[1:]), "cpu_bind": "numa"})
        replica, _ = worker(cgd, "cpu")
        assert replica["cpu_binding"] is None, "no GPU, no NUMA-local CPUs to bind to"

    asyncio.run(through_the_client())


def test_a_binding_to_cpus_this_host_lacks_is_shown_not_applied(start_cgd: Callable[..., Cgd]) -> None:
    cgd = start_cgd(str(MIXED))  # NUMA node 0: CPUs 0-7 with GPUs 0-1, node 1: CPUs 8-15 with GPUs 2-3
    ok(cgd, "allocate", "far", "--gpus", "1", "--gpu-ids", "2", *CMD)
    ok(cgd, "allocate", "far2", "--gpus", "1", "--gpu-ids", "3", *CMD)
    for name in ("far", "far2"):
        replica, pid = worker(cgd, name)
        assert replica["cpu_binding"] == "8-15" and proc_env(pid)["CG_CPUS"] == "8-15"
        assert psutil.Process(pid).cpu_affinity() == HOST
    assert listed_cpus(cgd, "far") == "8-15"
    wait_for(lambda: "CPU binding 8-15" in cgd.log(), "the log says it is not applied")
    assert cgd.log().count("CPU binding 8-15") == 1, "said once"
    assert "not applied: CPUs" in cgd.log()


def test_the_default_follows_the_config(start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text('[workers]\ncpu_bind = "none"\n')
    cgd = start_cgd(str(MIXED), "--config", str(config))
    ok(cgd, "allocate", "w", "--gpus", "1", *CMD)
    assert worker(cgd, "w")[0]["cpu_binding"] is None
    ok(cgd, "allocate", "v", "--gpus", "1", "--cpu-bind", "numa", *CMD)
    assert worker(cgd, "v")[0]["cpu_binding"] in ("0-7", "8-15")
    deployment = tmp_path / "d.toml"
    deployment.write_text(f'name = "d"\n[[claims]]\nname = "g"\ngpus = 1\n[[components]]\nname = "x"\n'
                          f'cpu_bind = "numa"\ncommand = [{json.dumps(sys.executable)}, "-c", "import time; '
                          'time.sleep(3600)"]\nsharing = [{ claim = "g", scope = "per-replica" }]\n')
    ok(cgd, "apply", "-f", str(deployment))
    replica, pid = worker(cgd, "d-0-x")
    assert replica["cpu_binding"] in ("0-7", "8-15") and proc_env(pid)["CG_CPUS"] == replica["cpu_binding"]
    one_node = tmp_path / "one-node.toml"
    one_node.write_text(MIXED.read_text().replace('cpus = "0-7"\ngpus = "0-1"', 'cpus = "0-15"\ngpus = "0-3"')
                        .replace('[[numa]]\nnode = 1\ncpus = "8-15"\ngpus = "2-3"\n', ""))
    single = start_cgd(str(one_node))
    assert list(single.request("GET", "/v1/machine")[1]["numa_nodes"]) == ["0"]
    ok(single, "allocate", "w", "--gpus", "1", *CMD)
    assert worker(single, "w")[0]["cpu_binding"] is None, "one NUMA node: nothing to bind by default"
