"""The pictures cgctl draws, from documents shaped like cgd's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from computegroups.cli.render import (
    bar,
    colour_enabled,
    component_json,
    component_text,
    device_label,
    devices_label,
    list_text,
    size,
    styler,
)
from tests.cli.samples import IN_THE_WAY, LONG_NAME, component, cpu_replica, crowded_list, device, listed

plain = styler(False)


def test_component_json_has_the_documented_keys_only() -> None:
    doc = component_json(component())
    assert set(doc) == {"name", "owner", "state", "replicas_wanted", "scope", "share_with", "group", "shadow_of",
                        "command", "restart", "time_limit_s", "ended_at", "duration_s", "exit_code", "queue",
                        "explanation", "replicas"}
    replica = doc["replicas"][0]
    assert set(replica) == {"index", "group", "groups", "role", "state", "restarts", "devices",
                            "cuda_visible_devices", "cpus", "cpu_binding", "pids", "started_at", "ended_at",
                            "exit_code"}
    assert replica["devices"] == [{"index": 0, "uuid": "GPU-0000", "mig_uuid": None,
                                   "memory_mib": 81559, "compute_pct": 100}]


def test_a_run_of_whole_gpus_is_a_range() -> None:
    assert devices_label([device(i) for i in range(8)]) == "0-7"
    assert devices_label([device(0), device(1), device(2, 20480, 30, False), device(3)]) == "0,1,2[20GiB/30%],3"


def test_device_labels() -> None:
    assert device_label(device(3)) == "3"
    assert device_label(device(1, 20480, 30, False)) == "1[20GiB/30%]"
    assert device_label(device(1, 81559, 100, False)) == "1[79.6GiB/100%]"
    assert device_label(device(1, 512, 5, False)) == "1[512MiB/5%]"
    assert device_label(device(2, 10240, 100, True, "MIG-1234567890abcdef")) == "2:MIG-12345678"


def test_devices_join_with_commas() -> None:
    assert devices_label([device(0), device(3)]) == "0,3" and devices_label([]) == "-"


def test_sizes() -> None:
    assert (size(512), size(20480), size(None)) == ("512 MiB", "20.0 GiB", "?")


def test_component_text_lists_replicas_and_explains_on_demand() -> None:
    lines = component_text(component(), "allocated", explain=True)
    assert lines[0] == "allocated web: 2 replicas (running)"
    assert "web-1" in lines[2] and "1[20GiB/30%]" in lines[2] and "pids 4243" in lines[2]
    assert lines[-1] == "why: GPU 0: emptiest NVLink island"
    assert not any(line.startswith("why") for line in component_text(component(), "allocated"))


def test_a_long_explanation_is_wrapped_within_80_columns() -> None:
    why = ("GPUs 4,7: connected over NVLink, one model on NUMA node 1; NVLink sum 2, weakest pair 2; "
           "leaves 5,6 as a 2-link pair; PCIe closeness 2")
    lines = component_text({**component(), "explanation": why}, "allocated", explain=True)
    why_lines = lines[lines.index(next(line for line in lines if line.startswith("why: "))):]
    assert len(why_lines) > 1 and all(len(line) <= 80 for line in why_lines)
    assert " ".join(line.strip() for line in why_lines) == f"why: {why}"


def test_what_allocate_prints_fits_the_terminal_with_a_long_name() -> None:
    c = {**component(f"{LONG_NAME}1"), "explanation": "GPU 0: emptiest NVLink island"}
    c["replicas"][1]["pids"] = list(range(4242, 4262))
    lines = component_text(c, "started", explain=True, width=60)
    assert all(len(line) <= 60 for line in lines), [line for line in lines if len(line) > 60]
    assert lines[0] == f"started {LONG_NAME}1: 2 replicas" and lines[1] == "  (running)"
    assert lines[2].startswith(f"  0  {LONG_NAME}1-0  primary") and lines[3].startswith("     ")
    assert ",".join(map(str, range(4242, 4262))) in "".join(line.strip() for line in lines)  # broken, not lost
    assert component_text(component(), "allocated") == component_text(component(), "allocated", width=200)


def test_list_is_a_table_with_owner_and_reservations() -> None:
    reservation = {"name": "train", "owner": {"uid": 1001, "user": "bob"}, "expires_at": None,
                   "priority": 0, "groups": [{"id": "train-0", "devices": [device(5)]}]}
    lines = list_text([component()], [reservation])
    assert lines[0].split() == ["NAME", "REPLICA", "GROUP", "ROLE", "STATE", "GPUS", "CPUS", "PIDS", "OWNER"]
    assert lines[1].split() == ["web", "0", "web-0", "primary", "running", "0", "-", "4242", "ada"]
    assert lines[4].split() == ["RESERVATION", "GROUPS", "GPUS", "OWNER", "EXPIRES"]
    assert lines[5].split() == ["train", "train-0", "5", "bob", "never"]


def test_list_fits_the_terminal_with_long_names_and_wraps_the_queue() -> None:
    wide = list_text(crowded_list(), [], 200)
    assert max(map(len, wide)) > 100 and f"{LONG_NAME}2" in wide[4]  # room enough: everything in full
    lines = list_text(crowded_list(), [], 80)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    # the long names keep their start and their end, which tell them apart; CPUS gave way to them
    assert lines[3].split()[0] == "a-very-...sting1" and lines[4].split()[0] == "a-very-...sting2"
    assert lines[4].split()[1:] == ["0", "a-ver...g2-0", "primary", "running", "3", "28945", "root"]
    assert lines[0].split() == ["NAME", "REPLICA", "GROUP", "ROLE", "STATE", "GPUS", "PIDS", "OWNER"]
    queue = lines[lines.index("queue:") + 1:]
    assert queue[0].startswith("  #1 eval: needs 8 whole GPUs") and queue[1].startswith("      ")
    assert " ".join(line.strip() for line in queue[:queue.index(next(q for q in queue if q.startswith("  #2")))]) == (
        f"#1 eval: {IN_THE_WAY}")
    at100 = list_text(crowded_list(), [], 100)  # the room left goes back to the names
    assert at100[3].split()[0] == "a-very-long-compo...ame-for-testing1" and max(map(len, at100)) == 100


@given(st.integers(min_value=1, max_value=200))
def test_list_is_never_wider_than_the_terminal(width: int) -> None:
    reservation = {"name": f"{LONG_NAME}-held", "owner": {"uid": 0, "user": "root"}, "expires_at": None,
                   "groups": [{"id": f"{LONG_NAME}-held-0", "devices": [device(2)]}]}
    lines = list_text(crowded_list(), [reservation], width)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]


def test_empty_list_says_how_to_start() -> None:
    assert "cgctl allocate" in list_text([], [])[0]


def test_bar_fills_in_proportion_and_never_overflows() -> None:
    assert bar([(40, "#")], 80, plain, "green") == "[" + "#" * 12 + "-" * 12 + "]"
    assert bar([(60, "#"), (60, "+")], 80, plain, "red") == "[" + "#" * 18 + "+" * 6 + "]"
    assert bar([(0, "#")], 0, plain, "green") == "[" + "-" * 24 + "]"


def test_colour_only_on_a_terminal_without_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert colour_enabled(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_enabled(Tty())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not colour_enabled(Tty())
    assert not colour_enabled(object())
    assert "\x1b[" in styler(True)("x", fg="red") and styler(False)("x", fg="red") == "x"


def test_a_cpu_only_replica_says_its_cpus_and_no_gpu() -> None:
    c = {**component("cpuonly", 1), "replicas": [{**cpu_replica(0, 4), "group": "cpuonly-0", "pids": [4242]}]}
    assert component_text(c, "started") == ["started cpuonly: 1 replica (running)",
                                            "  0  cpuonly-0  primary  4 CPUs  pids 4242"]
    c["replicas"][0]["cpu_binding"] = "0-3"
    assert component_text(c, "started")[1] == "  0  cpuonly-0  primary  4 CPUs (0-3)  pids 4242"


def test_a_narrow_list_keeps_role_while_a_shadow_is_listed() -> None:
    """At 52 columns something must go: PIDS before ROLE when ROLE tells primary from shadow, ROLE first
    when every replica is a primary."""
    primaries = [listed(f"{LONG_NAME}1", [0]), listed(f"{LONG_NAME}1-standby", [0])]
    shadowed = [primaries[0], {**primaries[1], "shadow_of": "web",
                               "replicas": [{**primaries[1]["replicas"][0], "role": "shadow"}]}]
    header = list_text(shadowed, [], 52)[0].split()
    assert "ROLE" in header and "PIDS" not in header
    assert [line.split()[2] for line in list_text(shadowed, [], 52)[1:3]] == ["primary", "shadow"]
    header = list_text(primaries, [], 52)[0].split()
    assert "ROLE" not in header and "PIDS" in header
    assert all(len(line) <= 52 for rows in (primaries, shadowed) for line in list_text(rows, [], 52))
