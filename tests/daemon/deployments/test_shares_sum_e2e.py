"""A worker holding several share groups on one device sees their sum, everywhere.

In docs/examples/grove-sharing.toml `rs-0-worker-a` holds four shares of one
GPU (a-slot 1 GiB, set-slot 2 GiB, a-rank 1 GiB, a-common 2 GiB): its
budget there is 6 GiB in its environment (CG_GPU_MEMORY_MIB and the MPS
limit), in `cgctl list`, `cgctl env`, the component's JSON and the Python
client, never the first share alone.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from computegroups.daemon.client import CgdClient
from tests.daemon.deployments.test_deployments_e2e import EXAMPLE, proc_env
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow

# nvidia-cuda-mps-control as far as cgd can tell: it writes the pid file `-d` should.
FAKE_MPS = """#!{python}
import os, sys
if sys.argv[1:] == ["-d"]:
    open(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "nvidia-cuda-mps-control.pid"), "w").write("1")
"""


def test_a_worker_sees_the_sum_of_its_shares_of_one_device(
    start_cgd: Callable[..., Cgd], tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mps = bin_dir / "nvidia-cuda-mps-control"
    mps.write_text(FAKE_MPS.format(python=sys.executable))
    mps.chmod(mps.stat().st_mode | stat.S_IXUSR)
    config = tmp_path / "cgd.toml"
    config.write_text("[shares]\nmps = true\n")
    cgd = start_cgd("dgx-h100", "--config", str(config), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    deployment = tmp_path / "grove.toml"
    deployment.write_text(EXAMPLE.read_text().replace('"python3"', json.dumps(sys.executable)))
    done = cgd.cgctl("apply", "-f", str(deployment))
    assert done.returncode == 0, done.stderr

    component = CgdClient(cgd.socket).get_component("rs-0-worker-a")
    (replica,) = component["replicas"]
    shares = [d for d in replica["devices"] if not d["whole"]]
    assert [(d["memory_mib"], d["compute_pct"]) for d in shares] == [(6144, 0)]
    gpu = shares[0]["index"]
    ordinal = replica["cuda_visible_devices"].split(",").index(str(gpu))

    env = proc_env(replica["pids"][0])
    assert env["CG_GPU_MEMORY_MIB"].split(",")[ordinal] == "6144"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{ordinal}=6144M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # memory-only shares leave the SMs alone

    sga = proc_env(CgdClient(cgd.socket).get_component("rs-0-sga-0-worker-b")["replicas"][0]["pids"][0])
    # set-slot 2 GiB, rank 1 GiB + 5%, kv 2 GiB, sga-pool 4 GiB + 10%, b-cache 512 MiB, b-common 1 GiB
    assert "10752" in sga["CG_GPU_MEMORY_MIB"].split(",")
    assert sga["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "15"

    listed = cgd.cgctl("list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("rs-0-worker-a "))
    assert f"{gpu}[6GiB/0%]" in row, listed.stdout
    printed = cgd.cgctl("env", "rs-0-worker-a").stdout
    assert f"export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={ordinal}=6144M" in printed, printed
