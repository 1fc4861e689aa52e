"""`cgctl topo` through click's runner and through the installed executable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from computegroups.cli.main import cli
from computegroups.cli.topo import topo_text
from computegroups.topology import load_machine
from computegroups.topology.model import Gpu, Machine
from tests.daemon_fixture import nvml_present

DGX1_NV1 = {(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)}
DGX1_NV2 = {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}


def cgctl(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, prog_name="cgctl")


def matrix(output: str) -> dict[tuple[int, int], str]:
    """The GPU x GPU cells of the `nvidia-smi topo -m` style table."""
    cells = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("GPU") and parts[0][3:].isdigit() and len(parts) > 2:
            row = int(parts[0][3:])
            for col, cell in enumerate(parts[1:]):
                if cell == "X" or cell.startswith(("NV", "SYS", "NODE", "PHB", "PXB", "PIX")):
                    cells[(row, col)] = cell
    return cells


def test_dgx1_matrix_shows_nv1_and_nv2_exactly_where_wired() -> None:
    result = cgctl("--simulate", "dgx1-v100", "topo")
    assert result.exit_code == 0, result.output
    cells = matrix(result.stdout)
    assert len(cells) == 64
    for a in range(8):
        for b in range(8):
            pair = (min(a, b), max(a, b))
            # every same-socket pair of a DGX-1 has NVLink, so the rest is SYS
            expected = ("X" if a == b else "NV1" if pair in DGX1_NV1
                        else "NV2" if pair in DGX1_NV2 else "SYS")
            assert cells[(a, b)] == expected, (a, b)


def test_text_has_gpus_islands_switch_and_numa() -> None:
    out = cgctl("--simulate", "dgx-h100", "topo").stdout
    assert "NVIDIA H100 80GB HBM3" in out and "81559 MiB" in out and "00000000:18:00.0" in out
    assert "NV18" in out and "0-55,112-167" in out
    assert "NVLink islands: {0-7}" in out
    assert "NVSwitch: 1 fabric, GPUs 0-7" in out
    assert "NUMA nodes: 0: GPUs 0-3, CPUs 0-55,112-167; 1: GPUs 4-7, CPUs 56-111,168-223" in out
    pairs = cgctl("--simulate", "workstation-nvlink-pairs", "topo").stdout
    assert "NVLink islands: {0-1} {2-3}" in pairs and "NVSwitch: no" in pairs


def test_each_nvswitch_fabric_is_named_by_its_gpus() -> None:
    assert "NVSwitch: 2 fabrics, GPUs 0-7 and 8-15" in cgctl("--simulate", "two-islands-16", "topo").stdout
    assert "NVSwitch: 3 fabrics, GPUs 0-7, 24-31 and 48-55" in cgctl("--simulate", "synthetic-72", "topo").stdout
    doc = json.loads(cgctl("--json", "--simulate", "two-islands-16", "topo").stdout)
    assert doc["nvswitch_fabrics"] == [list(range(8)), list(range(8, 16))]
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", name="x", pci_bus_id="", memory_mib=None, cpu_affinity=(0,))
                 for i in range(4))
    odd = Machine("h", gpus, (), nvswitch_fabrics=(frozenset({0, 2}), frozenset({1, 3})))
    assert "NVSwitch: 2 fabrics, GPUs {0,2} and {1,3}" in topo_text(odd)


def test_mig_devices_are_listed() -> None:
    out = cgctl("--simulate", "dgx-a100-mig", "topo").stdout
    assert "MIG 0: 3g.20gb  19968 MiB  GI 2 CI 0  MIG-" in out
    assert out.count(": 1g.5gb  4864 MiB") == 7


def test_cpu_only() -> None:
    result = cgctl("--simulate", "cpu-only", "topo")
    assert result.exit_code == 0 and "No GPUs." in result.stdout


def test_json_output() -> None:
    result = cgctl("--json", "--simulate", "dgx1-v100", "topo")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["source"] == "simulated:dgx1-v100"
    assert {(link["a"], link["b"]): link["nvlinks"] for link in doc["links"] if link["nvlinks"]} == {
        **{p: 1 for p in DGX1_NV1}, **{p: 2 for p in DGX1_NV2}}
    assert doc["links"][0]["pcie"] == "PIX"
    assert doc["nvswitch"] is False and doc["lost_gpus"] == []


def test_simulate_from_environment() -> None:
    result = cgctl("--json", "topo", env={"CG_SIMULATE": "workstation-4x-pcie"})
    assert json.loads(result.stdout)["source"] == "simulated:workstation-4x-pcie"


def test_unknown_machine_is_one_error_line() -> None:
    result = cgctl("--simulate", "dgx-9000", "topo")
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cgctl: error: dgx-9000: no such simulated machine")


def test_bad_machine_file_names_file_and_field(tmp_path: Path) -> None:
    box = tmp_path / "box.toml"
    box.write_text('gpu_count = 4\n[gpu_defaults]\nname = "x"\nmemory_mib = 10\n'
                   '[gpus.3]\nmemory_mib = "big"\n')
    result = cgctl("--simulate", str(box), "topo")
    assert result.exit_code == 1
    assert result.stderr == f"cgctl: error: {box}: gpus[3].memory_mib: expected an integer, got 'big'\n"


@pytest.mark.skipif(nvml_present(), reason="this box has an NVIDIA driver")
def test_without_nvml_the_error_suggests_simulate() -> None:
    result = cgctl("topo", env={"CG_SIMULATE": "", "CG_SOCKET": "/nonexistent/cgd.sock"})
    assert result.exit_code == 1
    assert result.stderr.startswith("cgctl: error: NVML is not available")
    assert "--simulate NAME" in result.stderr and "dgx-h100" in result.stderr


def test_usage_error_exits_2() -> None:
    assert cgctl("--simulate", "dgx-h100", "topo", "--bogus").exit_code == 2


def installed_cgctl() -> str:
    beside = Path(sys.executable).with_name("cgctl")
    found = str(beside) if beside.exists() else shutil.which("cgctl")
    if found is None:
        pytest.fail("cgctl is not installed: pip install -e .")
    return found


def test_installed_executable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CG_SIMULATE"}
    done = subprocess.run([installed_cgctl(), "--simulate", "dgx1-v100", "topo"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    cells = matrix(done.stdout)
    assert cells[(0, 1)] == "NV1" and cells[(0, 3)] == "NV2" and cells[(0, 5)] == "SYS"
    done = subprocess.run([installed_cgctl(), "--json", "topo"], capture_output=True, text=True,
                          env={**env, "CG_SIMULATE": "synthetic-72"}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["gpus"]) == 72
    done = subprocess.run([installed_cgctl(), "--simulate", "nope", "topo"], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.startswith("cgctl: error: nope:")


def block_cells(output: str) -> dict[tuple[int, int], str]:
    """The GPU x GPU cells of a matrix printed whole or in blocks: each block's head names its columns."""
    cells: dict[tuple[int, int], str] = {}
    heads: list[int] = []
    for line in output.splitlines():
        parts = line.split()
        if line.startswith(" ") and parts and all(p.startswith("GPU") for p in parts[:1]) and parts[0][3:].isdigit():
            heads = [int(p[3:]) for p in parts if p.startswith("GPU") and p[3:].isdigit()]
        elif heads and parts and parts[0].startswith("GPU") and parts[0][3:].isdigit():
            for col, cell in zip(heads, parts[1:], strict=False):
                cells[(int(parts[0][3:]), col)] = cell
        elif not parts:
            heads = []
    return cells


def test_seventy_two_gpus_fit_80_columns_as_islands_and_the_matrix_in_blocks() -> None:
    out = cgctl("--simulate", "synthetic-72", "topo").stdout.splitlines()
    assert all(len(line) <= 80 for line in out), [line for line in out if len(line) > 80]
    assert not block_cells("\n".join(out))  # no matrix: a line per NVLink island instead
    at = out.index(next(line for line in out if line.startswith("ISLAND")))
    assert out[at].split() == ["ISLAND", "GPUS", "MODEL", "NVLINK", "NUMA", "NEAREST", "OUTSIDE"]
    islands = out[at + 1:at + 21]
    assert islands[0].split() == ["0-7", "8", "A100", "80GB", "NV12,", "all", "pairs", "0", "NODE", "8-15"]
    assert islands[1].split()[4:10] == ["NV1-NV2,", "16", "of", "28", "pairs", "0"]
    assert islands[10].split()[4:6] == ["NV10-NV12,", "all"]  # GPU 55 has fewer links
    assert islands[12].split() == ["64", "1", "L40S", "-", "3", "PIX", "65-67"]
    assert any("`cgctl topo --matrix`" in line for line in out)
    assert "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA" in out  # wrapped
    assert "         nodes" in out

    full = cgctl("--simulate", "synthetic-72", "topo", "--matrix").stdout
    assert all(len(line) <= 80 for line in full.splitlines())
    cells = block_cells(full)
    assert len(cells) == 72 * 72
    assert cells[(0, 1)] == "NV12" and cells[(55, 48)] == "NV10" and cells[(0, 71)] == "SYS"
    assert cells[(64, 65)] == "PIX" and cells[(70, 70)] == "X"
    assert "GPU71  SYS" in full and "CPU Affinity    NUMA Affinity" in full


def test_eight_gpus_keep_the_matrix_as_nvidia_smi_prints_it() -> None:
    machine = load_machine("dgx-h100")
    wide = topo_text(machine, 200)
    assert wide[wide.index(next(line for line in wide if line.startswith("      GPU0")))].endswith(
        "GPU7  CPU Affinity    NUMA Affinity")
    at80 = topo_text(machine, 80)
    head = next(line for line in at80 if line.startswith("      GPU0"))
    assert head.endswith("GPU7  CPU Affinity    NUMA") and len(head) <= 80  # only the head gave way
    rows = [line for line in at80 if line.startswith("GPU") and line[3].isdigit()]
    assert rows == [line for line in wide if line.startswith("GPU") and line[3].isdigit()] and len(rows) == 8
    assert all(len(line) <= 80 for line in at80)


def test_no_line_is_wider_than_the_terminal() -> None:
    for name in ("dgx-h100", "dgx-a100-mig", "synthetic-72", "two-islands-16"):
        machine = load_machine(name)
        for width in (40, 60, 80, 120):
            for matrix in (False, True):
                lines = topo_text(machine, width, matrix)
                assert all(len(line) <= width for line in lines), (name, width, [x for x in lines if len(x) > width])
