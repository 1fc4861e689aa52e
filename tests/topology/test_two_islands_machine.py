"""The shipped two-islands-16 machine: two NVSwitch islands that never meet over NVLink."""

from __future__ import annotations

from computegroups.topology import load_machine, simulated_machine_names


def test_two_islands_16_is_shipped_with_its_two_uneven_islands() -> None:
    assert "two-islands-16" in simulated_machine_names()
    m = load_machine("two-islands-16")
    assert len(m.gpus) == 16
    assert m.nvlink_islands == (frozenset(range(8)), frozenset(range(8, 16)))
    assert {m.nvlinks(a, b) for a in range(8) for b in range(a + 1, 8)} == {12}
    assert {m.nvlinks(a, b) for a in range(8, 16) for b in range(a + 1, 16)} == {18}
    assert all(m.nvlinks(a, b) == 0 for a in range(8) for b in range(8, 16))
    assert m.gpus_by_numa == {0: tuple(range(8)), 1: tuple(range(8, 16))}
    assert {g.name for g in m.gpus[:8]} == {"NVIDIA A100-SXM4-80GB"}
    assert {g.name for g in m.gpus[8:]} == {"NVIDIA H100 80GB HBM3"}
    assert m.link(0, 1).pcie.label == "PIX" and m.link(0, 2).pcie.label == "NODE"
    assert m.link(0, 8).pcie.label == "SYS"


def test_each_island_is_an_nvswitch_fabric_of_its_own() -> None:
    m = load_machine("two-islands-16")
    assert m.nvswitch_fabrics == (frozenset(range(8)), frozenset(range(8, 16)))
    assert load_machine("dgx-h100").nvswitch_fabrics == (frozenset(range(8)),)
    assert load_machine("dgx1-v100").nvswitch_fabrics == () and not load_machine("dgx1-v100").has_nvswitch
