"""`cgctl status` and `cgctl top` as a person sees them: in a real terminal (tmux, 80x40), against a
real cgd on simulated 8- and 72-GPU machines, read back from the screen with `capture-pane`."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, _executable, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
GPU_ROW = re.compile(r"^\s*(\d+) ")


class Pane:
    """One tmux pane of a fixed size on a private server, running one command."""

    def __init__(self, root: Path, width: int, height: int) -> None:
        self.server = f"cg-status-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.root, self.width, self.height = root, width, height

    def tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(["tmux", "-L", self.server, *args], env=env, capture_output=True, text=True,
                              check=True, timeout=20).stdout

    def run(self, cgd: Cgd, *args: str) -> None:
        """Run `cgctl ARGS` in the pane; once it ends the pane says its exit status and whether the
        terminal is back in canonical mode (`icanon`, not `-icanon`)."""
        script = self.root / f"{uuid.uuid4().hex}.sh"
        # the shell outlives a Ctrl-C meant for cgctl (a trap, not an ignore: cgctl must still get it)
        script.write_text(f"trap : INT\n{shlex.join([_executable('cgctl'), *args])}\necho \"EXIT=$?\"\n"
                          "stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\{0,1\\}icanon'\nexec sleep 600\n")
        env = {**cgd.env(), "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        self.tmux("new-session", "-d", "-x", str(self.width), "-y", str(self.height), "-s", "main",
                  f"sh {shlex.quote(str(script))}", env=env)

    def screen(self, colours: bool = False) -> list[str]:
        """What the pane shows, with its colours as escape codes if asked."""
        return self.tmux("capture-pane", "-p", *(["-e"] if colours else []), "-t", "main").rstrip("\n").split("\n")

    def until(self, check: Callable[[list[str]], object], what: str, colours: bool = False) -> list[str]:
        """The screen once `check` holds for it (polled: a redraw comes when it comes, and a capture
        may catch one half done, so `check` says all that is asserted of the screen after)."""
        seen: list[list[str]] = []

        def look() -> object:
            seen[:] = [self.screen(colours)]
            return check(seen[0])

        try:
            wait_for(look, what, timeout=30)
        except AssertionError:
            raise AssertionError(f"{what}; the screen:\n" + "\n".join(seen[0] if seen else [])) from None
        return seen[0]

    def command_pid(self) -> int:
        """The pid of the command the pane's shell runs (its one child)."""
        shell = int(self.tmux("list-panes", "-t", "main", "-F", "#{pane_pid}").split()[0])
        children = Path(f"/proc/{shell}/task/{shell}/children")
        return int(wait_for(lambda: children.read_text().split(), "the pane's command started")[0])

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "main", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=20, check=False)
        folder = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}"
        (folder / self.server).unlink(missing_ok=True)  # tmux leaves the socket file behind


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[Callable[..., Pane]]:
    made: list[Pane] = []

    def make(width: int = 80, height: int = 40) -> Pane:
        made.append(Pane(tmp_path, width, height))
        return made[-1]

    yield make
    for p in made:
        p.close()


def measured_cgd(start_cgd: Callable[..., Cgd], tmp_path: Path, machine: str) -> Cgd:
    """A cgd that samples NVML every second (its samples go stale after 3 s), whose simulated GPU 0
    sees each worker use 3000 MiB and 40%."""
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 1\n")
    cgd = start_cgd(machine, "--config", str(config))
    cgd.faults_file.write_text(json.dumps({"worker_memory_mib": {"0": 3000}, "worker_utilization_pct": {"0": 40}}))
    return cgd


def ok(cgd: Cgd, *args: str) -> str:
    result = cgd.cgctl(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr, cgd.log())
    return result.stdout


def ended(screen: list[str]) -> bool:
    """Whether the pane's command has ended and its shell told how it left the terminal."""
    return any(line in ("icanon", "-icanon") for line in screen)


def rows(screen: list[str]) -> dict[int, str]:
    return {int(m.group(1)): line for line in screen if (m := GPU_ROW.match(line))}


def everyone(cgd: Cgd) -> None:
    """One of each state a GPU line tells apart, each on its own GPU, then one claim left waiting."""
    ok(cgd, "allocate", "web", "--gpus", "1", "--gpu-ids", "0", "--", *SLEEPER)
    ok(cgd, "allocate", "web-sb", "--shadow-of", "web", "--", *SLEEPER)
    ok(cgd, "allocate", "crash", "--gpus", "1", "--gpu-ids", "1", "--max-retries", "1000", "--", "sh", "-c", "exit 3")
    ok(cgd, "reserve", "later", "--gpus", "1", "--gpu-ids", "2")
    one_fails = 'if [ "$CG_REPLICA" = 1 ]; then exit 3; fi; exec sleep 600'
    ok(cgd, "allocate", "job", "--gpus", "1", "--gpu-ids", "3,4", "--replicas", "2", "--restart", "never",
       "--", "sh", "-c", one_fails)
    one_ends = 'if [ "$CG_REPLICA" = 1 ]; then exit 0; fi; exec sleep 600'
    ok(cgd, "allocate", "fin", "--gpus", "1", "--gpu-ids", "5,6", "--replicas", "2", "--", "sh", "-c", one_ends)
    ok(cgd, "allocate", "big", "--gpus", "8", "--detach", "--", "true")


def test_status_on_eight_gpus_one_line_each_with_who_in_which_state(
        start_cgd: Callable[..., Cgd], tmp_path: Path, pane: Callable[..., Pane]) -> None:
    cgd = measured_cgd(start_cgd, tmp_path, "dgx-h100")
    everyone(cgd)

    def settled() -> bool:
        text = ok(cgd, "status")
        return all(word in text for word in ("job:failed", "fin:completed", "80%"))

    wait_for(settled, "the replicas ended and NVML was sampled", timeout=30)
    p = pane()
    p.run(cgd, "status")
    screen = p.until(ended, "cgctl status ended")
    assert "EXIT=0" in screen and "icanon" in screen
    assert all(len(line) <= 80 for line in screen)
    assert screen[0].split() == ["GPU", "MODEL", "UTIL", "MEMORY", "used/claimed", "TEMP", "ON", "IT"]
    gpus = rows(screen)
    assert sorted(gpus) == list(range(8)) and all(re.match(rf"^\s*{i} ", screen[i + 1]) for i in range(8))
    # measured by the simulated NVML: two workers on GPU 0, 40% and 3000 MiB each, of 79.6 GiB claimed
    assert re.match(r"^\s*0 H100 80GB\s+80% \[#=======\]\s+5\.9/79\.6G\s+\d+C  web:run web-sb:shadow$", gpus[0])
    assert re.search(r"  crash:(restarting|start|run)$", gpus[1])
    assert gpus[2].endswith("  later:reserved") and " 0.0/79.6G " in gpus[2]  # held, nothing runs there
    assert gpus[3].endswith("  job:run") and gpus[4].endswith("  job:failed")
    assert gpus[5].endswith("  fin:run") and gpus[6].endswith("  fin:completed")
    assert re.search(r" \[--------\]\s+0\.0/0\.0G\s+\d+C$", gpus[7])  # free, nobody on it
    assert screen[9] == "" and re.match(r"^7/8 GPUs used \| .* \| 1 reserved \| 1 queued \| \d+ alerts?$", screen[10])
    glance = screen[screen.index("components:") + 1:]
    assert glance[0].split()[:3] == ["pending", "#1", "big"]


def test_watch_redraws_in_place_and_ctrl_c_gives_the_terminal_back(
        start_cgd: Callable[..., Cgd], tmp_path: Path, pane: Callable[..., Pane]) -> None:
    cgd = measured_cgd(start_cgd, tmp_path, "dgx1-v100")
    everyone(cgd)
    p = pane()
    p.run(cgd, "status", "--watch", "--interval", "0.2")

    def everyone_shown(s: list[str]) -> bool:
        g = rows(s)
        return (s[0].startswith("dgx1-sim  every 0.2s  ") and s[1].startswith("GPU MODEL")
                and g.get(0, "").startswith("  0 V100 16GB") and g.get(0, "").endswith("  web:run web-sb:shadow")
                and g.get(1, "").endswith("  crash:restarting") and g.get(4, "").endswith("  job:failed")
                and any(line.split()[:3] == ["pending", "#1", "big"] for line in s))  # the queue, under them

    screen = p.until(everyone_shown, "the watch shows everyone, crash restarting, job failed")
    assert all(len(line) <= 80 for line in screen)
    p.until(lambda s: "\x1b[33mcrash:restarting" in "".join(s) and "\x1b[31mjob:failed" in "".join(s),
            "restarting in yellow, failed in red", colours=True)

    ok(cgd, "release", "web-sb")
    ok(cgd, "release", "big")
    ok(cgd, "allocate", "late", "--gpus", "1", "--gpu-ids", "7", "--", *SLEEPER)
    p.until(lambda s: rows(s).get(0, "").endswith("  web:run") and rows(s).get(7, "").endswith("  late:run"),
            "the watch redraws with web-sb gone and late on GPU 7")

    cgd.stop()
    screen = p.until(lambda s: "  cgd: cgd is not running" in s[0], "the title says cgd went away")
    assert rows(screen)[7].endswith("  late:run")  # the last look stays on screen
    # and its measurements, ageing, read stale once they are (3 s, three of cgd's health periods, after its last sample)
    screen = p.until(lambda s: rows(s).get(0, "").split()[3:4] == ["?"] and any("! stale: GPU" in line for line in s),
                     "the last look's measurements read stale")
    assert rows(screen)[7].endswith("  late:run")

    p.keys("C-c")
    screen = p.until(ended, "cgctl ended on Ctrl-C")
    assert screen[0] == "EXIT=0" and screen[1] == "icanon"  # the alternate screen is gone, the tty canonical
    assert not rows(screen)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_top_gives_the_terminal_back_on_sigterm_and_sighup(
        cgd: Cgd, pane: Callable[..., Pane], signum: signal.Signals) -> None:
    p = pane()
    p.run(cgd, "top", "--interval", "0.2")
    p.until(lambda s: len(s) > 1 and s[1].startswith("GPU MODEL") and bool(rows(s)), "cgctl top draws the GPUs")
    os.kill(p.command_pid(), signum)
    screen = p.until(ended, f"cgctl top ended on {signum.name}")
    assert screen[:2] == ["EXIT=0", "icanon"]  # the alternate screen is gone, the tty canonical
    assert not rows(screen)


def test_top_ends_when_its_terminal_window_closes(cgd: Cgd, pane: Callable[..., Pane], tmp_path: Path) -> None:
    """The window closed (the tmux server killed) under a shell that does not pass SIGHUP on:
    cgctl top sees its terminal gone and exits 0, rather than spinning on a dead terminal."""
    p = pane()
    status = tmp_path / "status"
    # `trap '' HUP`: the shell outlives the hangup to write down how cgctl ended
    script = tmp_path / "closed.sh"
    script.write_text(f"trap '' HUP\n{shlex.join([_executable('cgctl'), 'top', '--interval', '0.2'])}\n"
                      f"echo $? > {shlex.quote(str(status))}\n")
    p.tmux("new-session", "-d", "-x", "80", "-y", "40", "-s", "main", f"sh {shlex.quote(str(script))}",
           env={**cgd.env(), "TERM": "xterm-256color"})
    p.until(lambda s: len(s) > 1 and s[1].startswith("GPU MODEL") and bool(rows(s)), "cgctl top draws the GPUs")
    p.close()
    assert wait_for(lambda: status.exists() and status.read_text(), "cgctl top ended", timeout=30) == "0\n"


def test_top_on_seventy_two_gpus_folds_nvlink_islands_and_opens_one(
        start_cgd: Callable[..., Cgd], tmp_path: Path, pane: Callable[..., Pane]) -> None:
    cgd = measured_cgd(start_cgd, tmp_path, "synthetic-72")
    ok(cgd, "allocate", "train", "--gpus", "8", "--gpu-ids", "0,1,2,3,4,5,6,7", "--", *SLEEPER)
    ok(cgd, "allocate", "web", "--gpus", "1", "--gpu-ids", "64", "--", *SLEEPER)
    islands = json.loads(ok(cgd, "--json", "topo"))["nvlink_islands"]
    assert len(islands) == 20

    plain = ok(cgd, "status").splitlines()  # not a terminal: one line per GPU at 80 columns, no folding
    assert len(rows(plain[1:73])) == 72 and all(len(line) <= 80 for line in plain)

    p = pane()
    p.run(cgd, "top")

    def folded(s: list[str]) -> list[str]:
        """The island lines: twelve to open, then the eight L40S without NVLink, a GPU line each."""
        lines = [line for line in s if line.startswith("+ ") or re.match(r"^ {5}6[4-9]|^ {5}7[01]", line)]
        whole = (len(lines) == 20 and "enter: open" in s[0] and lines[-1].startswith("     71 L40S")
                 and lines[0].startswith("+   0-7 A100 80GB") and lines[0].endswith("  train:run")
                 and lines[-8].startswith("     64 L40S") and lines[-8].endswith("  web:run"))
        return lines if whole else []

    screen = p.until(folded, "20 islands, 12 folded: train on 0-7 and web on 64")
    assert all(len(line) <= 80 for line in screen) and len(screen) <= 40
    assert sum(1 for line in screen if line.split()[:1] == ["66"]) == 1  # a one-GPU island shows once

    p.keys("Enter")

    def opened(s: list[str]) -> list[str]:
        """The eight lines under island 0-7 once it is open (a capture may catch a redraw half done)."""
        at = next((i for i, line in enumerate(s) if line.startswith("-   0-7")), None)
        below = s[at + 1:at + 9] if at is not None else []
        return below if [GPU_ROW.match(line) and int(line.split()[0]) for line in below] == list(range(8)) else []

    screen = p.until(opened, "island 0-7 opened")
    assert all(line.endswith("  train:run") for line in opened(screen)) and all(len(line) <= 80 for line in screen)

    p.keys("e", "e")  # every island open (the first e closes 0-7, the second opens all): End reaches the end
    p.until(lambda s: any(line.startswith("-  8-15") for line in s), "every island open")
    p.keys("End")
    screen = p.until(lambda s: re.match(r"^9/72 GPUs used \| 2 run \| ", s[-1]) is not None
                     and rows(s).get(71, "").startswith("     71 L40S"), "the last GPU and the summary in sight")
    total = screen[0].split()[-7].split("/")[1]
    assert screen[0].split()[-7] == f"{int(total) - 37}-{total}/{total}" and len(screen) == 40
    assert sum(1 for line in screen if line.split()[:1] == ["66"]) == 1
    p.keys("Home")
    p.until(lambda s: s[2].startswith("-   0-7 A100 80GB"), "back at the top")

    p.keys("q")
    screen = p.until(ended, "cgctl top ended on q")
    assert screen[:2] == ["EXIT=0", "icanon"]


def test_a_small_terminal_neither_wraps_nor_loses_who_is_on_a_gpu(
        start_cgd: Callable[..., Cgd], tmp_path: Path, pane: Callable[..., Pane]) -> None:
    cgd = measured_cgd(start_cgd, tmp_path, "dgx-h100")
    everyone(cgd)
    p = pane(44, 12)
    p.run(cgd, "top")
    # the bar and the model gave way; the GPUs fill the screen and the rest scrolls
    screen = p.until(lambda s: rows(s).get(0, "").endswith("  web:run +1") and s[1].split()[:2] == ["GPU", "UTIL"]
                     and list(rows(s)) == list(range(8)) and "1-10/" in s[0], "GPU 0 at 44 columns")
    assert all(len(line) <= 44 for line in screen) and len(screen) <= 12
    p.keys("End")
    screen = p.until(lambda s: any(line.split()[:3] == ["pending", "#1", "big"] for line in s)
                     and 0 not in rows(s) and s[1].split()[:2] == ["GPU", "UTIL"],  # the column heads stay
                     "scrolled down to the queue")
    assert all(len(line) <= 44 for line in screen)

    p.tmux("resize-window", "-t", "main", "-x", "30", "-y", "8")  # made smaller as it runs
    p.keys("Home")
    # drawn anew for 30 columns: no room to name anyone on GPU 0, so only how many
    screen = p.until(lambda s: re.match(r"^\s*0 +\S+ +\S+/79\.6G +\d+C  \+2$", rows(s).get(0, "")),
                     "redrawn for 30x8")
    assert len(screen) <= 8
    assert all(len(line) <= 30 for line in p.tmux("capture-pane", "-p", "-t", "main", "-S", "-", "-E", "-").split("\n"))
    p.keys("q")
    assert p.until(ended, "ended")[0] == "EXIT=0"


def test_events_and_list_take_the_terminals_width(cgd: Cgd, pane: Callable[..., Pane]) -> None:
    """Cut at 160 columns on a 160-column terminal (80 only when not on a terminal); `list` at 60
    columns fits 60."""
    name = "a-component-with-a-name-of-38-letters-"[:38]
    ok(cgd, "allocate", name, "--gpus", "1", "--", *SLEEPER)
    piped = ok(cgd, "events").splitlines()
    assert all(len(line) <= 80 for line in piped) and any(line.endswith("...") for line in piped)
    wide = pane(160, 30)
    wide.run(cgd, "events")
    screen = wide.until(ended, "cgctl events ended")
    assert "EXIT=0" in screen and any(len(line) > 80 and name in line for line in screen)
    assert all(len(line) <= 160 for line in screen)
    narrow = pane(60, 30)
    narrow.run(cgd, "list")
    screen = narrow.until(ended, "cgctl list ended")
    assert "EXIT=0" in screen and screen[0].split()[0] == "NAME" and all(len(line) <= 60 for line in screen)
    assert screen[1].startswith(name[:4]) and "..." in screen[1]


def test_long_status_shows_groups_made_on_their_own_within_the_terminal(
        start_cgd: Callable[..., Cgd], pane: Callable[..., Pane]) -> None:
    """`cgctl status --long` on a MIG box: a group no component uses yet, one shared by two, a MIG
    instance and a long-named component, at 80 columns (a pipe, a terminal) and at 60."""
    cgd = start_cgd("dgx-a100-mig")
    long_name = "trainer-with-a-rather-long-name-of-40-ch"
    ok(cgd, "allocate", long_name, "--gpus", "2", "--gpu-ids", "0,1", "--", *SLEEPER)
    unused = json.loads(ok(cgd, "--json", "group", "create", "--gpus", "1", "--gpu-ids", "2"))["id"]
    shared = json.loads(ok(cgd, "--json", "group", "create", "--gpus", "1", "--gpu-ids", "3"))["id"]
    mig = json.loads(ok(cgd, "--json", "group", "create", "--mig", "1g.5gb"))
    for name in ("a1", "a2"):
        ok(cgd, "allocate", name, "--group", shared, "--", *SLEEPER)
    mig_gpu, mig_uuid = mig["devices"][0]["index"], mig["devices"][0]["mig_uuid"]

    def shown(lines: list[str], width: int) -> None:
        assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
        text = "\n".join(lines)
        blocks = {int(b.split()[1]): b for b in text.split("\n\n") if b.startswith("GPU ")}
        assert f"  on it: {unused}:group" in blocks[2] and "  on it: a1:run, a2:run" in blocks[3]
        assert any(line.startswith(f"  mig 1g.5gb  {mig_uuid[:16]}") and line.endswith(f"  {mig['id']}")
                   for line in blocks[mig_gpu].splitlines())
        table = lines[lines.index("  GROUP    STATE      DEVICES         USED BY"):]
        assert table[1:4] == [f"  {unused}  allocated  2               -",
                              f"  {shared}  allocated  3               a1/0, a2/0",
                              f"  {mig['id']}  allocated  {mig_gpu}:{mig_uuid[:12]}  -"]

    piped = ok(cgd, "status", "--long").splitlines()
    shown(piped, 80)
    assert f"  on it: {long_name}:run (exclusive)" in piped  # in full: it fits
    for width in (80, 60):
        p = pane(width, 30)
        p.run(cgd, "status", "--long")
        p.until(ended, f"cgctl status --long ended at {width} columns")
        screen = p.tmux("capture-pane", "-p", "-t", "main", "-S", "-", "-E", "-").rstrip("\n").split("\n")
        assert "EXIT=0" in screen
        lines = screen[:screen.index("EXIT=0")]
        shown(lines, width)
        at = lines.index(f"  on it: {long_name}:run" + (" (exclusive)" if width == 80 else ""))
        assert width == 80 or lines[at + 1] == "         (exclusive)"  # wrapped under the list, not cut

    # --watch --long: the blocks redrawn, scrolled to the end, where a new group shows
    p = pane(80, 30)
    p.run(cgd, "status", "--watch", "--long", "--interval", "0.2")
    p.until(lambda s: "every 0.2s" in s[0] and s[1].startswith("8 GPUs: ") and s[3].startswith("GPU 0  NVIDIA"),
            "the watch draws the blocks")
    p.keys("End")
    screen = p.until(lambda s: s[-1] == f"  {mig['id']}  allocated  {mig_gpu}:{mig_uuid[:12]}  -",
                     "scrolled to the groups")
    total = int(re.findall(r" \d+-\d+/(\d+) ", screen[0])[0])
    cpus = json.loads(ok(cgd, "--json", "group", "create", "--cpus", "1"))["id"]
    p.until(lambda s: f"/{total + 1} " in s[0], "a line more to scroll to")
    p.keys("End")
    screen = p.until(lambda s: s[-1] == f"  {cpus}  allocated  1 CPU           -", "the new group shows")
    assert all(len(line) <= 80 for line in screen) and len(screen) <= 30
    p.keys("q")
    assert p.until(ended, "ended on q")[:2] == ["EXIT=0", "icanon"]
