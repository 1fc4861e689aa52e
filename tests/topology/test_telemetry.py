"""Telemetry on simulated machines, with faults injected through CG_SIM_FAULTS."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from computegroups.topology import open_gateway, simulated_gateway
from computegroups.topology.fakenvml import FakeNvml
from computegroups.topology.simfaults import FaultFileError
from computegroups.topology.telemetry import GpuProcess, Telemetry

FAULTS = {"xid": [{"gpu": 3, "code": 79}], "lost": [5],
          "processes": [{"gpu": 0, "pid": 1234, "used_memory_mib": 1000}],
          "temperature": {"2": 95}, "ecc_uncorrected": {"1": 4}}


class FaultFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 0

    def write(self, doc: dict) -> None:
        self.path.write_text(json.dumps(doc))
        self.version += 1  # make every write visible even within one mtime tick
        os.utime(self.path, ns=(self.version * 10**9, self.version * 10**9))


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultFile:
    path = tmp_path / "faults.json"
    monkeypatch.setenv("CG_SIM_FAULTS", str(path))
    return FaultFile(path)


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    gateway = open_gateway("dgx-h100")
    t = Telemetry(gateway)
    yield t
    t.close()
    gateway.close()


def test_quiet_machine(telemetry: Telemetry) -> None:
    samples = telemetry.sample()
    assert [s.index for s in samples] == list(range(8))
    s = samples[0]
    assert not s.lost and s.uuid and s.uuid.startswith("GPU-")
    assert (s.memory_used_mib, s.memory_total_mib) == (0, 81559)
    assert (s.temperature_c, s.ecc_uncorrected, s.remapped_rows_pending) == (35, 0, False)
    assert (s.xid_errors, s.processes, s.utilization_pct) == ((), (), 0)


def test_injected_faults(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write(FAULTS)
    samples = telemetry.sample()
    assert samples[3].xid_errors == (79,)
    assert samples[5].lost and samples[5].memory_total_mib is None
    assert samples[0].processes == (GpuProcess(1234, 1000),)
    assert samples[0].memory_used_mib == 1000
    assert samples[2].temperature_c == 95
    assert samples[1].ecc_uncorrected == 4
    assert all(not s.xid_errors for i, s in enumerate(samples) if i != 3)


def test_xid_is_delivered_once(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write({"xid": [{"gpu": 3, "code": 79}]})
    assert telemetry.sample()[3].xid_errors == (79,)
    assert telemetry.sample()[3].xid_errors == ()
    faults.write({"xid": [{"gpu": 3, "code": 79}], "temperature": {"3": 50}})  # re-read, same event
    assert telemetry.sample()[3].xid_errors == ()
    faults.write({"xid": [{"gpu": 3, "code": 79}, {"gpu": 3, "code": 79}, {"gpu": 1, "code": 48}]})
    samples = telemetry.sample()
    assert (samples[3].xid_errors, samples[1].xid_errors) == ((79,), (48,))


def test_faults_come_and_go(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write({"lost": [5]})
    assert telemetry.sample()[5].lost
    faults.write({})
    sample = telemetry.sample()[5]
    assert not sample.lost and sample.uuid
    faults.path.unlink()
    assert not any(s.lost for s in telemetry.sample())


def test_lost_gpu_keeps_its_uuid(telemetry: Telemetry, faults: FaultFile) -> None:
    uuid = telemetry.sample()[6].uuid
    faults.write({"lost": [6]})
    sample = telemetry.sample()[6]
    assert sample.lost and sample.uuid == uuid


def test_unsupported_counters_are_none(faults: FaultFile) -> None:
    faults.write({"remapped_rows_pending": [0], "processes": [{"gpu": 0, "pid": 7, "used_memory_mib": 1}]})
    fake = FakeNvml("dgx1-v100", unsupported={"nvmlDeviceGetTemperature": {1},
                                              "nvmlDeviceRegisterEvents": {2}},
                    missing={"nvmlDeviceGetComputeRunningProcesses_v3"})  # an older driver
    with simulated_gateway(fake) as gateway:
        samples = Telemetry(gateway).sample()
    assert samples[0].remapped_rows_pending is None  # Volta has no row remapping
    assert samples[1].temperature_c is None and samples[0].temperature_c == 35
    assert samples[2].xid_errors == ()
    assert samples[0].processes == () and samples[0].memory_used_mib == 1


def test_remapped_rows_and_utilization(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write({"remapped_rows_pending": [4], "utilization": {"4": 87}})
    sample = telemetry.sample()[4]
    assert sample.remapped_rows_pending is True and sample.utilization_pct == 87


def test_gpu_lost_during_sample() -> None:
    fake = FakeNvml("dgx-h100", lose_gpu_at={2: "nvmlDeviceGetTemperature"})
    with simulated_gateway(fake) as gateway:
        t = Telemetry(gateway)
        assert t.sample()[2].lost
        assert t.sample()[2].lost


def test_bad_fault_file_names_file_and_key(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write({"temperature": {"2": "hot"}})
    with pytest.raises(FaultFileError, match=r"faults.json: temperature.2: expected a non-negative integer"):
        telemetry.sample()
    faults.write({"xid": [{"gpu": 1}]})
    with pytest.raises(FaultFileError, match=r"xid\[0\]: expected an object with exactly gpu, code"):
        telemetry.sample()
    faults.write({"smoke": True})
    with pytest.raises(FaultFileError, match=r"smoke: unknown key"):
        telemetry.sample()


def test_half_written_file_keeps_the_last_faults(telemetry: Telemetry, faults: FaultFile) -> None:
    faults.write({"lost": [1]})
    assert telemetry.sample()[1].lost
    faults.path.write_text('{"lost": [')
    os.utime(faults.path, ns=(99 * 10**9, 99 * 10**9))
    assert telemetry.sample()[1].lost


def test_mps_clients_replace_their_server(telemetry: Telemetry, faults: FaultFile) -> None:
    """Under MPS the server is a compute process and its clients are listed apart."""
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "open('/proc/self/comm', 'w').write('nvidia-cuda-mps-server')\n"
        "print('named', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    try:
        assert server.stdout.readline().strip() == "named"
        faults.write({"processes": [{"gpu": 0, "pid": server.pid, "used_memory_mib": 3000},
                                    {"gpu": 0, "pid": 4321, "used_memory_mib": 500}],
                      "mps_processes": [{"gpu": 0, "pid": 1111, "used_memory_mib": 1000},
                                        {"gpu": 0, "pid": 2222, "used_memory_mib": 2000}]})
        assert telemetry.sample()[0].processes == (
            GpuProcess(4321, 500), GpuProcess(1111, 1000), GpuProcess(2222, 2000))
        faults.write({"processes": [{"gpu": 0, "pid": server.pid, "used_memory_mib": 3000}]})
        assert telemetry.sample()[0].processes == (GpuProcess(server.pid, 3000),)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
