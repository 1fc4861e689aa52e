"""The compact status from cgd's documents: one line per GPU, what it says, and that it fits."""

from __future__ import annotations

import copy

import click
from hypothesis import given
from hypothesis import strategies as st

from computegroups.cli.render import styler
from computegroups.cli.status import stale_after
from computegroups.cli.status_view import (
    STALE_AFTER_S,
    Board,
    gpu_lines,
    island_lines,
    memory_bar,
    occupants,
    short_model,
    status_json,
    status_lines,
    summary,
    summary_lines,
    tail_lines,
)
from tests.cli.samples import busy_machine, gpu, measured, owned, replica, with_cpu_only

plain = styler(False)


def board() -> Board:
    return Board.of(*busy_machine())


def rows(lines: list[str]) -> dict[str, str]:
    """The GPU lines by index, without the header (nor the summary, which may wrap at `  1 shadow`)."""
    gpus = lines[1:lines.index("")] if "" in lines else lines[1:]
    return {line.split()[0]: line for line in gpus if line[:3].strip().isdigit()}


def test_models_lose_vendor_and_form_factor() -> None:
    assert short_model("NVIDIA H100 80GB HBM3") == "H100 80GB"
    assert short_model("Tesla V100-SXM2-16GB") == "V100 16GB"
    assert short_model("NVIDIA A100-SXM4-40GB") == "A100 40GB"
    assert short_model("NVIDIA RTX A6000") == "RTX A6000"
    assert short_model("NVIDIA L40S") == "L40S"
    assert short_model("NVIDIA GeForce RTX 4090 Laptop GPU") == "RTX 4090 "[:9]
    assert short_model(None) == "-" and short_model("NVIDIA") == "-"


def test_one_line_per_gpu_with_measured_use_against_claimed() -> None:
    lines = status_lines(board(), plain)
    assert lines[0].split() == ["GPU", "MODEL", "UTIL", "MEMORY", "used/claimed", "TEMP", "ON", "IT"]
    gpus = rows(lines)
    assert list(gpus) == [str(i) for i in range(8)]
    assert gpus["0"] == "  0 H100 80GB  87% [#####===] 48.0/79.6G  61C  ada/web:run ada/web-sb:shadow"
    assert gpus["3"].split()[3:7] == ["35%", "[###===--]", "30.0/60.0G", "50C"]
    # a foreign process uses what cgd did not hand out: more in use than claimed
    assert gpus["7"].split()[3:7] == ["12%", "[####----]", "40.0/20.0G", "44C"]
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]


def test_unmeasured_values_read_as_a_dash() -> None:
    gpus = rows(status_lines(board(), plain))
    # no `measured` block yet (cgd has not sampled): the temperature cgd's health loop saw stays
    assert gpus["2"].split()[3:7] == ["-", "[????????]", "-/79.6G", "40C"]
    # a block whose NVML fields are unknown
    assert gpus["4"].split()[3:6] == ["-", "[????????]", "-/79.6G"]
    # an older cgd without the key at all
    old = copy.deepcopy(busy_machine())
    for g in old[0]["gpus"]:
        g.pop("measured", None)
        g.pop("temperature_c")
        g["components"] = [c["name"] if isinstance(c, dict) else c for c in g["components"]]
    line = rows(status_lines(Board.of(*old), plain))["0"]
    assert line.split()[3:7] == ["-", "[????????]", "-/79.6G", "-"] and "web:run" in line


SAMPLED = measured()["sampled_at"]


def test_old_measurements_read_as_stale_not_as_current() -> None:
    fresh = Board.of(*busy_machine(), now=SAMPLED + STALE_AFTER_S)
    assert status_lines(fresh, plain) == status_lines(board(), plain)
    assert not any(a.startswith("stale") for a in summary(fresh)["alerts"])

    old = Board.of(*busy_machine(), now=SAMPLED + 60)
    lines = status_lines(old, plain)
    gpus = rows(lines)
    # what NVML measured a minute ago is not shown as now; what cgd claimed and who is on it stay
    assert gpus["0"] == "  0 H100 80GB    ? [????????]    ?/79.6G    ?  ada/web:run ada/web-sb:shadow"
    assert gpus["7"].split()[3:7] == ["?", "[??------]", "?/20.0G", "?"]
    assert gpus["2"].split()[3:7] == ["-", "[????????]", "-/79.6G", "40C"]  # never sampled: not stale
    assert summary(old)["alerts"][0] == "stale: GPU 0,1,3,4,5,7 last measured 60s ago"
    assert summary_lines(old, 80)[-1].endswith(f"| {len(summary(fresh)['alerts']) + 1} alerts")
    assert "  ! stale: GPU 0,1,3,4,5,7 last measured 60s ago" in lines
    assert all(len(line) <= 80 for line in lines)
    folded = island_lines(old, [[0, 1], [2, 3, 4, 5, 6, 7]], set(), 80, plain)
    assert folded[1][1].split()[4:8] == ["?", "[????????]", "?/159G", "?"]
    g0 = status_json(old)["gpus"][0]
    assert g0["measured"] == {**measured(87, 49152, 61), "stale": True}


def test_stale_is_three_of_the_health_loops_periods_when_cgd_says_its_period() -> None:
    assert stale_after({"status": "ok", "last_sample": SAMPLED, "interval_s": 2.0}) == 6.0
    assert stale_after({"interval_s": 0.5}) == 1.5
    assert stale_after({"status": "ok", "last_sample": SAMPLED}) == STALE_AFTER_S  # an older cgd
    assert stale_after({"interval_s": None}) == stale_after({"interval_s": 0}) == STALE_AFTER_S
    slow = Board.of(*busy_machine(), now=SAMPLED + 20, stale_after_s=stale_after({"interval_s": 10}))
    assert not any(a.startswith("stale") for a in summary(slow)["alerts"])  # a loop set to 10 s: 20 s is fresh
    quick = Board.of(*busy_machine(), now=SAMPLED + 2, stale_after_s=stale_after({"interval_s": 0.5}))
    assert summary(quick)["alerts"][0] == "stale: GPU 0,1,3,4,5,7 last measured 2s ago"


def test_each_occupant_in_its_state() -> None:
    gpus = rows(status_lines(board(), plain))
    assert gpus["0"].endswith("  ada/web:run ada/web-sb:shadow")
    assert gpus["1"].endswith("  bob/crash:restarting")
    assert gpus["2"].endswith("  bob/later:reserved")
    assert gpus["4"].endswith("  carol/job:failed")  # a failed replica beside a completed one: the worse shows
    assert gpus["5"].endswith("DRAINED") and gpus["6"].endswith("FAILED DEGRADED")
    assert gpus["7"].endswith("FOREIGN ghost:-")  # on the GPU, not (yet) in the component list
    status = busy_machine()[0]
    done = [owned("job", "running", [replica(0, 4, "completed")])]
    assert [o.state for o in occupants(status["gpus"][4], {"job": done[0]}, {})] == ["completed"]


def test_users_are_named_only_when_more_than_one_holds_gpus() -> None:
    status, components, reservations = busy_machine()
    for doc in (*components, *reservations):
        doc["owner"]["user"] = "ada"
    gpus = rows(status_lines(Board.of(status, components, reservations), plain))
    assert gpus["0"].endswith("  web:run web-sb:shadow") and gpus["3"].endswith("  small-a:run small-b:run +1")
    assert gpus["2"].endswith("  later:reserved")


def test_a_promoted_shadow_reads_as_running() -> None:
    status, _, _ = busy_machine()
    promoted = owned("web-sb", "running", [replica(0, 0, role="primary")], shadow_of="web")
    found = occupants(status["gpus"][0], {"web-sb": promoted}, {})
    assert [(o.name, o.state) for o in found] == [("web-sb", "running"), ("web", "-")]


def test_more_occupants_than_fit_end_in_plus_n() -> None:
    gpus = rows(status_lines(board(), plain))
    assert gpus["3"].endswith("  ada/small-a:run +2")
    many = gpu(0, components=[f"component-{i}" for i in range(9)])
    line = rows(gpu_lines(Board.of({"gpus": [many]}, [], []), 80, plain))["0"]
    assert line.endswith("component-0:- component-1:- +7") and len(line) <= 80


def test_the_most_worrying_occupant_comes_first() -> None:
    status = {"gpus": [gpu(0, components=["a-ok", "z-bad"])]}
    comps = [owned("a-ok", "running", [replica(0, 0)]), owned("z-bad", "failed", [replica(0, 0, "failed")])]
    assert rows(gpu_lines(Board.of(status, comps, []), 80, plain))["0"].endswith("z-bad:failed a-ok:run")


def test_summary_counts_components_queue_and_alerts() -> None:
    s = summary(board())
    assert (s["gpus"], s["gpus_in_use"], s["components"], s["reservations"], s["pending"]) == (8, 6, 8, 1, 1)
    assert s["components_by_state"] == {"restarting": 1, "running": 5, "shadow": 1, "pending": 1}
    assert s["alerts"] == ["GPU 6 FAILED DEGRADED: Xid 79: fell off the bus",
                           "GPU 7 FOREIGN: pid 777 (20.0 GiB)", "crash restarting"]
    assert summary_lines(board(), 80) == [
        "6/8 GPUs used | 1 restarting, 5 run, 1 shadow | 1 reserved | 1 queued | 3 alerts"]


def test_the_summary_counts_by_state_at_every_width_and_wraps_between_its_parts() -> None:
    assert summary_lines(board(), 60) == ["6/8 GPUs used | 1 restarting, 5 run, 1 shadow | 1 reserved",
                                          "| 1 queued | 3 alerts"]
    assert summary_lines(board(), 36) == ["6/8 GPUs used | 1 restarting, 5 run,", "  1 shadow | 1 reserved | 1 queued",
                                          "| 3 alerts"]
    status, components, _ = busy_machine()
    for c in components:
        c["state"] = "running"
    quiet = Board.of(status, components, [])
    # counts that are zero give way before anything wraps
    assert summary_lines(quiet, 80) == ["6/8 GPUs used | 7 run, 1 shadow | 0 reserved | 0 queued | 3 alerts"]
    assert summary_lines(quiet, 50) == ["6/8 GPUs used | 7 run, 1 shadow | 3 alerts"]
    # nothing allocated reads the same at every width (never `0 components`)
    empty = Board.of({"gpus": [gpu(i) for i in range(8)]}, [], [])
    assert summary_lines(empty, 80) == ["0/8 GPUs used | no components | 0 reserved | 0 queued | 0 alerts"]
    assert summary_lines(empty, 60) == ["0/8 GPUs used | no components | 0 alerts"]
    assert summary_lines(empty, 30) == ["0/8 GPUs used | no components", "| 0 alerts"]


@given(st.integers(min_value=1, max_value=100))
def test_the_summary_never_outgrows_the_terminal(width: int) -> None:
    lines = summary_lines(board(), width)
    assert all(len(line) <= width for line in lines) and all(lines)
    if width >= 15:  # no part is cut: every count is still there
        assert [w for w in " ".join(lines).split() if w.isdigit() or "/" in w] == [
            "6/8", "1", "5", "1", "1", "1", "3"]


def test_the_queue_and_what_restarts_follow_the_summary() -> None:
    lines = status_lines(board(), plain)
    at = lines.index(summary_lines(board(), 80)[0])
    assert lines[at + 1:at + 4] == ["  ! GPU 6 FAILED DEGRADED: Xid 79: fell off the bus",
                                    "  ! GPU 7 FOREIGN: pid 777 (20.0 GiB)", "  ! crash restarting"]
    assert lines[at + 5] == "components:"
    assert lines[at + 6].split()[:4] == ["pending", "#1", "big", "carol"]
    assert lines[at + 7].split() == ["restarting", "crash", "bob", "3", "restarts"]


def test_state_loss_comes_first() -> None:
    status, components, reservations = busy_machine()
    status["state_loss"] = [{"replica": "old/0", "pids": [9], "user": "ada", "devices": "3"}]
    lines = status_lines(Board.of(status, components, reservations), plain)
    assert lines[0].startswith("WARNING cgd's state lost a generation")
    assert "  ! old/0 kept from a lost state generation" in lines


def test_memory_bar() -> None:
    assert memory_bar(0, 0, 80) == "[--------]"
    assert memory_bar(40, 80, 80) == "[####====]"
    assert memory_bar(None, 40, 80) == "[????----]"
    assert memory_bar(90, 40, 80) == "[########]"  # more in use than claimed: foreign or over its share
    assert memory_bar(10, 10, 0) == "[--------]"


def test_narrow_terminals_drop_the_bar_then_the_model_and_keep_who() -> None:
    at70 = rows(status_lines(board(), plain, 70))
    assert "[" not in at70["0"] and "H100 80GB" in at70["0"] and at70["0"].endswith("ada/web:run ada/web-sb:shadow")
    at40 = rows(status_lines(board(), plain, 40))
    assert at40["0"] == "  0  87% 48.0/79.6G  61C  ada/web:run +1"
    assert at40["1"] == "  1   0%  0.0/79.6G  35C  bob/cr...rting"  # shortened in the middle: its state shows


@given(st.integers(min_value=1, max_value=160))
def test_no_line_is_ever_wider_than_the_terminal(width: int) -> None:
    b = board()
    lines = status_lines(b, plain, width)
    lines += [text for _, text in island_lines(b, [[0, 1, 2, 3], [4, 5, 6, 7]], {1}, width, plain)]
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]


def test_islands_fold_into_one_line_each() -> None:
    b = board()
    tagged = island_lines(b, [[0, 1, 2, 3], [4, 5, 6, 7]], set(), 80, plain)
    assert [n for n, _ in tagged] == [None, 0, 1]
    first = tagged[1][1]
    # mean measured utilisation of those measured, memory summed, the hottest, everyone on it
    assert first == "+   0-3 H100 80GB  40% [##======]  78.0/299G  61C  bob/crash:restarting +6"
    assert "+ 4-7" in tagged[2][1].replace("   ", " ") and "FAILED" in tagged[2][1]
    opened = island_lines(b, [[0, 1, 2, 3], [4, 5, 6, 7]], {1}, 80, plain)
    assert [n for n, _ in opened] == [None, 0, 1, 1, 1, 1, 1]
    assert opened[2][1].startswith("- ") and opened[3][1].split()[0] == "4"


def test_json_is_a_stable_projection() -> None:
    doc = status_json(board())
    assert set(doc) == {"generation", "gpus", "lost_groups", "own_groups", "state_loss", "components", "summary"}
    g0 = doc["gpus"][0]
    assert set(g0) == {"index", "uuid", "name", "memory_mib", "memory_allocated_mib", "memory_foreign_mib",
                       "compute_allocated_pct", "exclusive_owner", "components", "groups", "health", "reasons",
                       "drained", "degraded", "foreign_processes", "over_share", "held_by_lost",
                       "mig_devices", "temperature_c",
                       "measured", "occupants"}
    assert g0["components"] == ["web", "web-sb"]
    assert g0["measured"] == {**measured(87, 49152, 61), "stale": False}
    assert g0["occupants"] == [
        {"name": "web", "user": "ada", "state": "running", "memory_used_mib": 40960},
        {"name": "web-sb", "user": "ada", "state": "shadow", "memory_used_mib": 8192}]
    assert doc["gpus"][2]["measured"] is None
    assert doc["gpus"][2]["occupants"] == [{"name": "later", "user": "bob", "state": "reservation",
                                            "memory_used_mib": None}]
    assert doc["summary"]["pending"] == 1 and len(doc["summary"]["alerts"]) == 3


def test_colour_on_a_terminal_marks_states_without_moving_a_column() -> None:
    coloured = status_lines(board(), styler(True))
    assert "\x1b[32mada/web:run\x1b[0m" in coloured[1] and "\x1b[36mada/web-sb:shadow\x1b[0m" in coloured[1]
    assert "\x1b[33mbob/crash:restarting" in coloured[2] and "\x1b[31mcarol/job:failed" in coloured[5]
    assert "\x1b[33m\x1b[1mDRAINED" in coloured[6] and "\x1b[31m\x1b[1mFAILED" in coloured[7]
    assert [click.unstyle(line) for line in coloured] == status_lines(board(), plain)


def test_an_occupant_only_the_gpu_entry_knows_reads_as_that_entry_says() -> None:
    listed = gpu(0, components=[
        {"name": "new", "user": "dan", "state": "running", "reservation": False, "shadow_of": None,
         "memory_used_mib": 10},
        {"name": "new-sb", "user": "dan", "state": "running", "reservation": False, "shadow_of": "new",
         "memory_used_mib": None},
        {"name": "hold", "user": "dan", "state": "reserved", "reservation": True, "shadow_of": None,
         "memory_used_mib": None},
        "bare"])
    assert [tuple(o) for o in occupants(listed, {}, {})] == [
        ("new", "dan", "running", 10), ("new-sb", "dan", "shadow", None), ("hold", "dan", "reservation", None),
        ("bare", None, "-", None)]


def test_a_group_of_its_own_that_no_component_uses_is_named_on_its_gpu() -> None:
    status = {"gpus": [gpu(0, groups=["group.5", "group.6", "web-0"], memory_allocated_mib=40960,
                           components=["web"])]}
    groups = [{"id": "group.5", "owner": "@1000", "users": []},
              {"id": "group.6", "owner": "@1000", "users": ["web/0"]},  # used: the component is named
              {"id": "web-0", "owner": "web", "users": ["web/0"]}]
    shown = Board.of(status, [owned("web", "running", [replica(0, 0)])], [], groups=groups)
    assert rows(gpu_lines(shown, 80, plain))["0"].endswith("  web:run group.5:group")
    assert [o["name"] for o in status_json(shown)["gpus"][0]["occupants"]] == ["web", "group.5"]
    assert status_json(shown)["own_groups"] == groups[:2]  # every group made on its own, used or not


def test_names_in_the_status_keep_their_start_and_end() -> None:
    long = "a-very-long-component-name-that-goes-on-1"
    status = {"gpus": [gpu(0, components=[long, "b", "c"])]}
    line = rows(gpu_lines(Board.of(status, [], []), 80, plain))["0"]
    assert "..." in line and line.endswith("on-1:- +2") and len(line) <= 80
    pending = {"name": "abcdefghij-abcdefghij-abcdefghij-end", "state": "pending", "user": "ada",
               "queue": {"position": 1, "reason": "needs 8 whole GPUs"}}
    glance = status_lines(Board.of({"gpus": [gpu(0)], "components": [pending]}, [], []), plain)
    assert any("pending #1  abcdefghij-...efghij-end" in text for text in glance), glance


def test_a_marked_gpu_still_names_who_is_on_it_shortened() -> None:
    long = "trainer-with-a-rather-long-name"
    status = {"gpus": [gpu(0, drained=True, components=[long, "zz"]), gpu(1, drained=True, components=[long])]}
    found = rows(gpu_lines(Board.of(status, [], []), 80, plain))
    assert found["0"].endswith("  DRAINED trainer-wi...ng-name:- +1") and len(found["0"]) == 80  # was `DRAINED +2`
    assert found["1"].endswith("  DRAINED trainer-wit...long-name:-") and len(found["1"]) == 80


def test_components_on_cpus_alone_have_a_line_under_the_summary() -> None:
    lines = status_lines(Board.of(*with_cpu_only()), plain)
    cpu_at = lines.index("CPU only: 8 CPUs  bob/etl:run ada/prep:held")
    assert lines.index("") < cpu_at < next(n for n, line in enumerate(lines) if line.startswith("  ! ")), lines
    assert not any(line.startswith("CPU only") and ("later-cpu" in line or "done" in line) for line in lines)
    assert not any(line.startswith("CPU only") for line in status_lines(board(), plain))
    assert tail_lines(Board.of(*with_cpu_only()), 80, plain)[0] == lines[cpu_at], "folded islands show it too"
    narrow = status_lines(Board.of(*with_cpu_only()), plain, 40)
    assert "CPU only: 8 CPUs  bob/etl:run +1" in narrow


@given(st.integers(min_value=1, max_value=160))
def test_the_cpu_line_fits_any_width(width: int) -> None:
    lines = status_lines(Board.of(*with_cpu_only()), plain, width)
    assert all(len(line) <= width for line in lines)
    assert width < 20 or any(line.startswith("CPU only: 8 CPUs") for line in lines)
