"""`cgctl status --long` from cgd's documents: a block per GPU, the groups made on their own, and that it fits."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import click
from hypothesis import given
from hypothesis import strategies as st

from computegroups.cli.render import styler
from computegroups.cli.status_long import flow, long_lines
from computegroups.cli.status_view import Board, status_json
from tests.cli.samples import busy_machine, component, device, gpu, owned, replica, status, with_cpu_only

plain = styler(False)
MIG = "MIG-bcac02b9-3c3c-566b-aec4-37e3a01f6f9f"
TRAINER = "trainer-with-a-rather-long-name"


def blocks(lines: list[str]) -> list[str]:
    """The text between blank lines: the count, then a block per GPU, then what follows."""
    return "\n".join(lines).split("\n\n")


def test_each_gpu_with_bars_marks_and_who_is_on_it() -> None:
    parts = blocks(long_lines(Board.of(status(), [component()], []), plain))
    assert parts[0] == "4 GPUs: 2 in use, 1 drained, 1 unhealthy"
    assert parts[1].splitlines() == ["GPU 0  NVIDIA H100 80GB HBM3  util -  40C  ok",
                                     "  mem [" + "#" * 24 + "] 80.0/80.0 GiB", "  sm  [" + "#" * 24 + "] 100%",
                                     "  on it: web:run (exclusive)"]
    assert parts[2].splitlines()[0].endswith("  FOREIGN") and "(20.0 GiB foreign)" in parts[2]
    assert "#" * 6 + "+" * 6 + "-" * 12 in parts[2] and "  why: pid 777 (20.0 GiB)" in parts[2]
    assert parts[3].splitlines()[0].endswith("  DRAINED")
    assert parts[4].splitlines()[0].endswith("  FAILED  DEGRADED") and "  why: Xid 79: fell off the bus" in parts[4]


def test_measured_values_come_from_the_same_look_as_the_one_line_view() -> None:
    doc, components, reservations = busy_machine()
    sampled = doc["gpus"][0]["measured"]["sampled_at"]
    fresh = blocks(long_lines(Board.of(doc, components, reservations, now=sampled + 1), plain))
    assert fresh[1].splitlines()[0] == "GPU 0  NVIDIA H100 80GB HBM3  util 87%  61C  ok"
    old = blocks(long_lines(Board.of(doc, components, reservations, now=sampled + 60), plain))
    assert old[1].splitlines()[0] == "GPU 0  NVIDIA H100 80GB HBM3  util ?  ?  ok"  # stale: not passed off as now


def test_who_is_on_each_gpu_reads_as_in_the_one_line_view() -> None:
    board = Board.of(*busy_machine())
    parts = blocks(long_lines(board, plain))
    assert "  on it: ada/web:run (exclusive), ada/web-sb:shadow" in parts[1]
    assert "  on it: bob/crash:restarting" in parts[2] and "  on it: bob/later:reserved" in parts[3]
    assert "  on it: ghost:-" in parts[8]
    for g, part in zip(status_json(board)["gpus"], parts[1:9], strict=True):
        on_it = " ".join(line for line in part.splitlines() if line.startswith(("  on it:", "         ")))
        assert [o["name"] for o in g["occupants"]] == [
            w.split(":")[0].split("/")[-1] for w in on_it.removeprefix("  on it:").split()
            if ":" in w and w != "(exclusive),"]


def standalone() -> Board:
    """An A100 box with a group of its own on each kind of device: one no component uses yet, one
    shared by two components, a MIG instance, a share, one of CPUs only; and a long-named component."""
    gpus = [
        gpu(0, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, memory_allocated_mib=40960, compute_allocated_pct=100,
            groups=["group.1"], components=[]),
        gpu(1, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, memory_allocated_mib=40960, compute_allocated_pct=100,
            groups=["group.2"], components=["a1", "a2"]),
        gpu(2, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, memory_allocated_mib=40960, compute_allocated_pct=100,
            groups=[f"{TRAINER}-0"], components=[TRAINER], exclusive_owner=TRAINER),
        gpu(3, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, memory_allocated_mib=30720, compute_allocated_pct=50,
            groups=["group.4", "s1-0"], components=["s1"]),
        gpu(7, name="NVIDIA A100-SXM4-40GB", memory_mib=40960, memory_allocated_mib=4864, compute_allocated_pct=None,
            groups=["group.3"], components=[],
            mig_devices=[{"uuid": MIG, "profile": "1g.5gb", "memory_mib": 4864, "group": "group.3"},
                         {"uuid": MIG.replace("bcac", "1512"), "profile": "1g.5gb", "memory_mib": 4864,
                          "group": None}]),
    ]
    groups: list[dict[str, Any]] = [
        {"id": "group.1", "owner": "@1000", "state": "allocated", "devices": [device(0)], "users": []},
        {"id": "group.2", "owner": "@1000", "state": "allocated", "devices": [device(1)], "users": ["a1/0", "a2/0"]},
        {"id": "group.3", "owner": "@1000", "state": "allocated", "devices": [device(7, 4864, mig=MIG)],
         "users": []},
        {"id": "group.4", "owner": "@1000", "state": "draining", "devices": [device(3, 20480, 30, whole=False)],
         "users": []},
        {"id": "group.5", "owner": "@1000", "state": "allocated", "devices": [], "claim": {"cpus": 4},
         "users": ["etl/0"]},
        {"id": f"{TRAINER}-0", "owner": TRAINER, "state": "allocated", "devices": [device(2)], "users": []},
    ]
    components = [owned(name, "running", [replica(0, index)]) for name, index in
                  (("a1", 1), ("a2", 1), (TRAINER, 2), ("s1", 3))]
    return Board.of({"gpus": gpus}, components, [], groups=groups)


def test_groups_made_on_their_own_are_shown_on_their_gpus_and_listed_with_who_uses_them() -> None:
    parts = blocks(long_lines(standalone(), plain))
    assert "  on it: group.1:group" in parts[1]  # no component on GPU 0: the group holds it
    assert "  on it: a1:run, a2:run" in parts[2]
    assert "  on it: s1:run, group.4:group" in parts[4]
    assert f"  mig 1g.5gb  {MIG}  group.3" in parts[5] and "  on it: group.3:group" in parts[5]
    assert parts[6].splitlines() == [
        "groups made on their own (`cgctl group create`):",
        "  GROUP    STATE      DEVICES         USED BY",
        "  group.1  allocated  0               -",
        "  group.2  allocated  1               a1/0, a2/0",
        "  group.3  allocated  7:MIG-bcac02b9  -",
        "  group.4  draining   3[20GiB/30%]    -",
        "  group.5  allocated  4 CPUs          etl/0"]


def test_without_groups_of_their_own_there_is_no_such_section() -> None:
    assert not any("made on their own" in line for line in long_lines(Board.of(*busy_machine()), plain))


def test_at_80_and_60_columns_nothing_is_cut_without_a_mark() -> None:
    at80 = long_lines(standalone(), plain, 80)
    assert all(len(line) <= 80 for line in at80), [line for line in at80 if len(line) > 80]
    assert f"  on it: {TRAINER}:run (exclusive)" in at80 and not any("..." in line for line in at80)
    at60 = long_lines(standalone(), plain, 60)
    assert all(len(line) <= 60 for line in at60), [line for line in at60 if len(line) > 60]
    assert "  mem [" + "#" * 24 + "] 40.0/40.0 GiB" in at60  # the bars keep their width while they fit
    assert any(line.startswith("  mig 1g.5gb  MIG-bcac02b9-3c3c-") and line.endswith("...  group.3") for line in at60)
    at40 = long_lines(standalone(), plain, 40)
    assert all(len(line) <= 40 for line in at40), [line for line in at40 if len(line) > 40]
    assert "GPU 0  A100 40GB  util -  40C  ok" in at40  # the vendor and the form factor go before the marks wrap
    assert "  mem [" + "#" * 18 + "] 40.0/40.0 GiB" in at40  # narrower bars
    at = at40.index("GPU 2  A100 40GB  util -  40C  ok")
    assert at40[at + 3:at + 5] == ["  on it: trainer-with-a...-long-name:run", "         (exclusive)"]
    assert at40[-8:-6] == ["groups made on their own", "  (`cgctl group create`):"]
    assert "  group.2  1               a1/0, a2/0" in at40  # the state made room for who uses the group


def test_a_long_reason_wraps_under_why_and_marks_wrap_under_the_gpu() -> None:
    reason = "Xid 79: the GPU has fallen off the bus; the driver could not reach it at /dev/nvidia0 again"
    doc = {"gpus": [gpu(0, health="failed", degraded=True, drained=True, reasons=[reason],
                        foreign_processes=[{"pid": 777, "used_memory_mib": 2048}])]}
    lines = long_lines(Board.of(doc, [], []), plain, 50)
    assert lines[2:4] == ["GPU 0  H100 80GB  util -  40C  FAILED  DEGRADED", "  DRAINED  FOREIGN"]
    why = lines[lines.index(next(line for line in lines if line.startswith("  why: "))):]
    assert all(len(line) <= 50 for line in lines) and all(line.startswith("       ") for line in why[1:])
    assert " ".join(" ".join(why).split()) == f"why: {reason}; pid 777 (2.0 GiB)"


def test_the_queue_and_what_ended_follow_within_the_width() -> None:
    long_reason = ("needs 8 whole GPUs; 1 free: GPU 7 (not free: in use by alice (component train): GPUs 0-5; "
                   "in use by bob (reservation later): GPU 6)")
    ended = [{"name": f"job-{i}", "state": "completed", "user": "alice", "exit_code": 0, "duration_s": 2.0 + i,
              "restarts": 0, "queue": None} for i in range(7)]
    doc = {**status(), "components": [
        {"name": "big", "state": "pending", "user": "carol", "queue": {"position": 1, "reason": long_reason},
         "restarts": 0},
        {"name": "web", "state": "restarting", "user": "bob", "queue": None, "restarts": 3},
        *ended]}
    for width in (80, 60):
        lines = long_lines(Board.of(doc, [], []), plain, width)
        listed = lines[lines.index("components:") + 1:]
        assert listed[0].startswith("  pending #1  big    carol  needs 8 whole GPUs;") and listed[0].endswith("...")
        assert listed[1].split() == ["restarting", "web", "bob", "3", "restarts"]
        assert len(listed) == 2 + 5 + 1 and "and 2 more that ended" in listed[-1]  # five ended at most
        assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert long_lines(Board.of(status(), [], []), plain)[-1] != "components:"  # nothing to list: no section


def test_lost_groups_are_listed() -> None:
    doc = {"gpus": [gpu(0)], "lost_groups": [{"id": "old-0", "owner": "old", "devices": [device(7)]}]}
    lines = long_lines(Board.of(doc, [], []), plain)
    assert lines[-2:] == ["LOST groups whose devices vanished:", "  old-0  old  7"]


@given(st.integers(min_value=1, max_value=160))
def test_no_line_is_ever_wider_than_the_terminal(width: int) -> None:
    lost = {"lost_groups": [{"id": f"{TRAINER}-lost-7", "owner": TRAINER, "devices": [device(7, mig=MIG)]}]}
    for board in (standalone(), Board.of(*busy_machine()), Board.of({**status(), **lost}, [component()], [])):
        lines = long_lines(board, plain, width)
        assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]


@given(st.integers(min_value=40, max_value=160))
def test_the_layout_fits_before_the_last_cut(width: int) -> None:
    """`clip` is the net under the layout, not the layout: at a usable width nothing falls into it."""
    lost = {"lost_groups": [{"id": f"{TRAINER}-lost-7", "owner": TRAINER, "devices": [device(7, mig=MIG)]}]}
    with patch("computegroups.cli.status_long.clip", lambda text, _width: text):
        for board in (standalone(), Board.of(*busy_machine()), Board.of({**status(), **lost}, [component()], [])):
            lines = long_lines(board, plain, width)
            assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]


def test_colour_moves_no_column() -> None:
    board = Board.of(*busy_machine())
    coloured = long_lines(board, styler(True), 60)
    assert "\x1b[32mada/web:run\x1b[0m" in "\n".join(coloured) and "\x1b[31m\x1b[1mFAILED" in "\n".join(coloured)
    assert [click.unstyle(line) for line in coloured] == long_lines(board, plain, 60)


def test_flow_wraps_words_and_keeps_the_ends_of_one_too_long() -> None:
    words = [(w, w) for w in ("a,", "bb,", "a-very-long-word-indeed", "c")]
    assert flow(words, 12, "x: ", "   ") == ["x: a, bb,", "   a-v...eed", "   c"]
    assert flow([], 12, "x: ", "   ") == []


def test_gpus_alike_are_named_alike_when_one_needs_the_short_name() -> None:
    doc = {"gpus": [gpu(0), gpu(1, drained=True, degraded=True, health="failed")]}
    heads = [line for line in long_lines(Board.of(doc, [], []), plain, 60) if line.startswith("GPU ")]
    assert heads == ["GPU 0  H100 80GB  util -  40C  ok", "GPU 1  H100 80GB  util -  40C  FAILED  DEGRADED  DRAINED"]
    alone = long_lines(Board.of({"gpus": [gpu(0)]}, [], []), plain, 60)
    assert alone[2] == "GPU 0  NVIDIA H100 80GB HBM3  util -  40C  ok"


def test_components_on_cpus_alone_are_listed_after_the_gpus() -> None:
    parts = blocks(long_lines(Board.of(*with_cpu_only()), plain))
    assert "CPU only: bob/etl:run (4 CPUs), ada/prep:held (4 CPUs)" in parts
    assert blocks(long_lines(Board.of(*with_cpu_only()), plain, 40)).count(
        "CPU only: bob/etl:run (4 CPUs),\n          ada/prep:held (4 CPUs)") == 1
    assert not any(line.startswith("CPU only") for line in long_lines(Board.of(*busy_machine()), plain))
