"""CPU-only components: supervised like any other, with no GPU to see.

A claim of `cpus` alone places no device and counts its CPUs against the
machine's (never more than it has); on a machine without GPUs a component
with a command needs no claim at all (one CPU is counted for it). Either way the worker's CUDA_VISIBLE_DEVICES is
empty, so it never touches a GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Callable

import pytest

from computegroups.daemon.client import CgdError, ComputeGroupManager, LocalComputeResourceProvider
from tests.daemon.core.test_groups_e2e import ok, refused
from tests.daemon.deployments.test_deployments_e2e import proc_env
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
CMD = ("--", sys.executable, "-c", "import time\nwhile True: time.sleep(3600)")


def test_a_machine_without_gpus_runs_components(start_cgd: Callable[..., Cgd]) -> None:
    cgd = start_cgd("cpu-only")
    out = ok(cgd, "allocate", "plain", *CMD)
    assert "1 CPU  pids" in out and "CUDA_VISIBLE_DEVICES" not in out, out
    _, plain = cgd.request("GET", "/v1/components/plain")
    env = proc_env(plain["replicas"][0]["pids"][0])
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not any(k.startswith("CG_GPU_") for k in env)
    cpus = len(os.sched_getaffinity(0))
    assert json.loads(ok(cgd, "--json", "topo"))["cpus"] == sorted(os.sched_getaffinity(0))

    assert plain["replicas"][0]["cpus"] == 1, "a process with no claim still runs on a CPU: one is counted"

    ok(cgd, "allocate", "counted", "--cpus", str(cpus - 1), *CMD)
    state = cgd.state()
    err = refused(cgd, "allocate", "more", "--cpus", "1", *CMD)
    assert f"needs 1 CPU; 0 of the machine's {cpus} are not claimed" in err, err
    err = refused(cgd, "allocate", "shared", "--memory", "1GiB")
    assert "this machine has no GPU: claim cpus alone" in err and "MIG" not in err, err
    err = refused(cgd, "allocate", "whole", "--gpus", "1")
    assert "this machine has no GPU" in err and "GPUs" not in err, err
    err = refused(cgd, "allocate", "nocmd")
    assert "no claim, no command and no group to attach to holds and runs nothing" in err, err
    for args in (("allocate", "cz", "--cpus", "0"), ("group", "create", "--cpus", "0")):
        done = cgd.cgctl(*args)
        assert done.returncode != 0 and "cpus: must be between 1 and" in done.stderr, (args, done.stderr)
    err = refused(cgd, "allocate", "huge", "--cpus", str(cpus + 1))
    assert f"needs {cpus + 1} CPUs; this machine has {cpus}" in err, err
    listed = ok(cgd, "list")
    assert "GPUS" in listed and re.search(rf"counted .* {cpus - 1} CPUs? ", listed), listed
    assert cgd.state() == state, "refusals change nothing"
    ok(cgd, "release", "counted")
    ok(cgd, "allocate", "more", "--cpus", "1", "--replicas", str(cpus - 1), *CMD)
    assert len(cgd.worker_pids()) == cpus


def test_cpus_are_counted_beside_gpus(cgd: Cgd) -> None:
    total = len(json.loads(ok(cgd, "--json", "topo"))["cpus"])
    assert total == 224, "the simulated dgx-h100's two NUMA nodes of 112 CPUs"
    ok(cgd, "allocate", "train", "--gpus", "1", "--cpus", "200", *CMD)
    _, train = cgd.request("GET", "/v1/components/train")
    assert train["replicas"][0]["cpus"] == 200 and train["replicas"][0]["cuda_visible_devices"]
    err = refused(cgd, "allocate", "prep", "--cpus", "16", "--replicas", "2")
    assert "needs 32 CPUs (2 groups of 16); 24 of the machine's 224 are not claimed" in err, err
    usage = cgd.cgctl("allocate", "prep", "--cpus", "8", "--gpu-ids", "0")
    assert usage.returncode == 2 and "--gpu-ids chooses among GPUs: a --cpus claim alone has none" in usage.stderr
    status, reply = cgd.request("POST", "/v1/components", {"name": "prep", "claim": {"cpus": 2, "pool": "a"}})
    assert status == 400 and "pool: a CPU-only claim (cpus alone) places no GPU" in reply["error"]["message"]
    usage = cgd.cgctl("allocate", "nothing", *CMD)
    assert usage.returncode == 2, usage.stderr
    assert "say what nothing needs: --gpus N, --memory SIZE, --mig PROFILE or --cpus N" in usage.stderr
    status, reply = cgd.request("POST", "/v1/components", {"name": "nothing"})
    assert status == 400 and reply["error"]["message"].startswith("claim: required"), "only without GPUs"

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        group = await m.allocate_compute_group("prep", {"cpus": 24}, {"command": list(CMD[1:])})
        assert group.devices == [] and group.resources["claim"] == {"cpus": 24} and group.gpu_indices == []
        with pytest.raises(CgdError, match="needs 1 CPU; 0 of the machine's 224 are not claimed"):
            await m.allocate_compute_group("more", {"cpus": 1})

    asyncio.run(through_the_client())
    _, prep = cgd.request("GET", "/v1/components/prep")
    assert proc_env(prep["replicas"][0]["pids"][0])["CUDA_VISIBLE_DEVICES"] == ""
    ok(cgd, "release", "train")
    ok(cgd, "allocate", "more", "--cpus", "200", *CMD)
