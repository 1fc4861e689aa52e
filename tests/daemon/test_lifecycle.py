"""cgd's start: the README's first command runs on a simulated machine where there is no driver."""

from __future__ import annotations

import pytest

from tests.daemon_fixture import Cgd, nvml_present


class FallbackCgd(Cgd):
    """`cgd --simulate-fallback NAME`, as the README's quick start runs it: no --simulate."""

    def command(self) -> list[str]:
        argv = super().command()
        at = argv.index("--simulate")
        return [*argv[:at], "--simulate-fallback", argv[at + 1], *argv[at + 2:]]


@pytest.mark.skipif(nvml_present(), reason="this box has an NVIDIA driver: cgd uses it")
def test_without_a_driver_the_fallback_machine_is_served_and_no_one_is_told_to_use_simulate(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    cgd = FallbackCgd(tmp_path_factory.mktemp("cgd"), "dgx-h100", (), {})
    try:
        cgd.start()
        status, machine = cgd.request("GET", "/v1/machine")
        assert status == 200 and machine["source"] == "simulated:dgx-h100"
        log = cgd.log()
        assert "no NVIDIA driver here (" in log and "running on the simulated machine dgx-h100" in log
        assert "--simulate NAME" not in log, "the fallback already simulates: no advice to do it"
    finally:
        cgd.cleanup()
