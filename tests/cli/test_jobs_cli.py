"""Jobs through cgctl, as a new user types them: finish, fail, wait, queue, the caller's PATH and env."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import psutil
import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow


def ok(cgd: Cgd, *args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> str:
    done = cgd.cgctl(*args, env=env, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout, done.stderr, cgd.log())
    return done.stdout


def test_a_oneshot_job_runs_once_frees_its_gpu_and_wait_says_0(cgd: Cgd) -> None:
    out = ok(cgd, "allocate", "oneshot", "--gpus", "8", "--", "sh", "-c", "echo hi; exit 0")
    assert out.startswith("started oneshot"), out
    done = cgd.cgctl("wait", "oneshot", "--timeout", "20s")
    assert done.returncode == 0 and done.stdout.startswith("oneshot completed after"), done
    assert (cgd.log_dir / "oneshot" / "0.out").read_text() == "hi\n"
    ok(cgd, "allocate", "next", "--gpus", "8")  # the GPUs came back
    listed = ok(cgd, "list")
    assert "completed (0)" in listed and all(len(line) <= 80 for line in listed.splitlines()), listed


def test_a_failing_job_retries_then_fails_and_wait_exits_with_its_code(cgd: Cgd) -> None:
    ok(cgd, "allocate", "crash", "--gpus", "1", "--max-retries", "1", "--", "sh", "-c", "echo run; exit 3")
    done = cgd.cgctl("wait", "crash")
    assert done.returncode == 3 and "crash failed" in done.stdout, done
    assert (cgd.log_dir / "crash" / "0.out").read_text() == "run\nrun\n"
    listed = json.loads(ok(cgd, "--json", "list"))
    (crash,) = [c for c in listed["components"] if c["name"] == "crash"]
    assert crash["state"] == "failed" and crash["exit_code"] == 3 and crash["replicas"][0]["restarts"] == 1


def test_wait_on_a_time_limit_exits_124(cgd: Cgd) -> None:
    ok(cgd, "allocate", "slow", "--gpus", "1", "--time-limit", "0.5s", "--", "sleep", "60")
    done = cgd.cgctl("wait", "slow")
    assert done.returncode == 124 and "slow timeout" in done.stdout, done


def test_two_whole_box_jobs_with_wait_run_one_after_the_other(cgd: Cgd, tmp_path: Path) -> None:
    marks = tmp_path / "order"
    job = f"echo start $CG_COMPONENT >> {marks}; sleep 0.3; echo end $CG_COMPONENT >> {marks}"
    ok(cgd, "allocate", "a", "--gpus", "8", "--wait", "--", "sh", "-c", job)
    done = cgd.cgctl("allocate", "b", "--gpus", "8", "--wait", "5m", "--", "sh", "-c", job, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("started b"), done
    assert "queued b: position 1" in done.stderr, done.stderr
    ok(cgd, "wait", "b")
    assert marks.read_text().split("\n")[:4] == ["start a", "end a", "start b", "end b"]


def test_a_detached_claim_survives_kill_9_of_cgd_and_still_starts(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    ok(cgd, "allocate", "holder", "--gpus", "8", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    out = ok(cgd, "allocate", "later", "--gpus", "8", "--detach", "--", "sh", "-c", "echo ran")
    assert out.startswith("queued later: position 1"), out
    cgd.kill9()
    cgd.start()
    assert "pending #1" in ok(cgd, "list")
    go.touch()
    ok(cgd, "wait", "later", "--timeout", "20s")
    assert (cgd.log_dir / "later" / "0.out").read_text() == "ran\n"


def test_wait_gives_up_at_its_timeout_and_withdraws_the_claim(cgd: Cgd) -> None:
    ok(cgd, "allocate", "holder", "--gpus", "8")
    done = cgd.cgctl("allocate", "hopeful", "--gpus", "1", "--wait", "0.3s", "--", "true")
    assert done.returncode == 1 and "not placed within 0.3s; its claim is withdrawn" in done.stderr, done
    assert cgd.cgctl("wait", "hopeful").returncode == 1  # no such component any more


def test_a_worker_started_from_a_venv_runs_the_venvs_python(cgd: Cgd, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv), "MY_SETTING": "on"}
    ok(cgd, "allocate", "venv-job", "--gpus", "1", "--", "python", "-c",
       "import os, sys; print(sys.prefix); print(os.environ.get('MY_SETTING'))", env=env)
    ok(cgd, "wait", "venv-job")
    assert (cgd.log_dir / "venv-job" / "0.out").read_text().split("\n")[:2] == [str(venv), "None"]
    ok(cgd, "allocate", "exported", "--gpus", "1", "--export-env", "--env", "EXTRA=1", "--", "sh", "-c",
       "echo $MY_SETTING $EXTRA $CUDA_VISIBLE_DEVICES", env={**env, "CUDA_VISIBLE_DEVICES": "7,6"})
    ok(cgd, "wait", "exported")
    on, extra, devices = (cgd.log_dir / "exported" / "0.out").read_text().split()
    assert (on, extra) == ("on", "1") and devices != "7,6"


def test_a_command_that_cannot_start_fails_allocate(cgd: Cgd) -> None:
    done = cgd.cgctl("allocate", "typo", "--gpus", "1", "--", "pyhton", "train.py")
    assert done.returncode == 1 and "pyhton" in done.stderr and len(done.stderr.splitlines()) == 1, done
    gone = cgd.cgctl("wait", "typo")
    assert gone.returncode == 1 and "no component named 'typo'" in gone.stderr, gone



def test_logs_points_at_stderr_and_shows_how_a_failed_replica_ended(cgd: Cgd) -> None:
    ok(cgd, "allocate", "broken", "--gpus", "1", "--restart", "never", "--", "sh", "-c",
       "echo 'ModuleNotFoundError: No module named torch' >&2; exit 1")
    assert cgd.cgctl("wait", "broken").returncode == 1
    done = cgd.cgctl("logs", "broken")
    assert done.returncode == 0 and done.stdout == "", done
    assert "nothing on stdout" in done.stderr and "--stream stderr" in done.stderr, done.stderr
    assert "its last lines (failed):\nModuleNotFoundError: No module named torch" in done.stderr, done.stderr


def test_release_takes_a_stop_timeout_for_a_worker_that_ignores_sigterm(cgd: Cgd) -> None:
    stubborn = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    ok(cgd, "allocate", "stubborn", "--gpus", "1", "--", "sh", "-c", stubborn)
    wait_for(lambda: (cgd.log_dir / "stubborn" / "0.out").read_text() == "ready\n", "the worker up")
    pids = cgd.worker_pids()
    started = time.monotonic()
    out = ok(cgd, "release", "stubborn", "--stop-timeout", "0.5s")
    assert out.startswith("released stubborn"), out
    assert time.monotonic() - started < 8, "the component's own 10 s grace was used, not --stop-timeout"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    bad = cgd.cgctl("release", "--all", "--stop-timeout", "1s")
    assert bad.returncode == 2 and "name them" in bad.stderr, bad


def test_cuda_variables_of_the_user_reach_the_worker_and_only_cgds_own_are_refused(cgd: Cgd) -> None:
    """CUDA_HOME is the user's; CUDA_VISIBLE_DEVICES and CG_* are cgd's: refused with --env, before
    anything is allocated, and dropped from --export-env."""
    ok(cgd, "allocate", "cuda-home", "--gpus", "1", "--export-env", "--env", "CUDA_HOME=/opt/cuda", "--",
       "sh", "-c", "echo $CUDA_HOME $CUDA_CACHE_PATH $CUDA_VISIBLE_DEVICES; sleep 60",
       env={"CUDA_CACHE_PATH": "/tmp/cc", "CUDA_VISIBLE_DEVICES": "7", "CG_GROUP": "lie"})
    out = cgd.log_dir / "cuda-home" / "0.out"
    wait_for(lambda: out.exists() and out.read_text().endswith("\n"), "the worker's line")
    assert out.read_text().split() == ["/opt/cuda", "/tmp/cc", "0"]
    exported = ok(cgd, "env", "cuda-home")
    assert "CUDA_VISIBLE_DEVICES=0" in exported and "CUDA_HOME" not in exported, exported
    for variable in ("CUDA_VISIBLE_DEVICES=3", "CUDA_MPS_PIPE_DIRECTORY=/x", "CG_ROLE=primary"):
        done = cgd.cgctl("allocate", "liar", "--gpus", "1", "--env", variable, "--", "true")
        key = variable.split("=")[0]
        assert done.returncode == 1 and f"env.{key}: " in done.stderr and "set by cgd" in done.stderr, done
    assert "liar" not in ok(cgd, "list")


@pytest.mark.skipif(os.geteuid() != 0, reason="cgd runs workers as root only when it runs as root")
def test_the_loaders_variables_never_reach_a_root_worker_by_any_path(cgd: Cgd, tmp_path: Path) -> None:
    done = cgd.cgctl("allocate", "preload", "--gpus", "1", "--env", "LD_PRELOAD=/x.so", "--", "true")
    assert done.returncode == 1 and "env.LD_PRELOAD: not passed to a worker that runs as root" in done.stderr
    deployment = tmp_path / "preload.toml"
    deployment.write_text('name = "pre"\n\n[[components]]\nname = "c"\n'
                          'command = ["sh", "-c", "echo [$LD_PRELOAD]; sleep 60"]\n'
                          'env = { LD_PRELOAD = "/x.so", MODEL = "m" }\n')
    done = cgd.cgctl("apply", "-f", str(deployment))
    assert done.returncode == 1, done
    assert "components[0].env.LD_PRELOAD: not passed to a worker that runs as root" in done.stderr, done
    assert cgd.state()["components"] == {} and cgd.state()["deployments"] == {}
    assert not (cgd.log_dir / "pre-0-c").exists()


def test_run_wait_queues_runs_once_placed_and_explains_the_placed_claim(cgd: Cgd, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ok(cgd, "allocate", "holder", "--gpus", "8", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    run = subprocess.Popen(
        [str(Path(sys.executable).parent / "cgctl"), "run", "--name", "later", "--gpus", "2", "--wait",
         "--explain", "--", "sh", "-c", "echo devices $CUDA_VISIBLE_DEVICES"],
        env=cgd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "pending #1" in ok(cgd, "list"), "the run's claim queued")
    go.touch()
    out, err = run.communicate(timeout=30)
    assert run.returncode == 0, (out, err)
    assert "queued later: position 1" in err, err
    assert "allocated later: 1 replica (allocated)" in err, err
    assert "why: GPUs" in err and "cgd gave no explanation" not in err, err
    assert len(out.split()) == 2 and out.split()[1].count(",") == 1, out  # two devices, once placed
    wait_for(lambda: "later" not in ok(cgd, "list"), "the run's lease released")


def test_status_shows_the_queue_and_the_jobs_that_ended(cgd: Cgd) -> None:
    ok(cgd, "allocate", "done", "--gpus", "1", "--", "true")
    ok(cgd, "allocate", "crash", "--gpus", "1", "--restart", "never", "--", "sh", "-c", "exit 3")
    assert cgd.cgctl("wait", "crash").returncode == 3 and cgd.cgctl("wait", "done").returncode == 0
    ok(cgd, "allocate", "holder", "--gpus", "7")
    ok(cgd, "allocate", "big", "--gpus", "8", "--detach", "--", "true")
    text = ok(cgd, "status")
    glance = text.split("components:\n", 1)[1].splitlines()
    assert glance[0].split()[:4] == ["pending", "#1", "big", "root"] and "needs 8 whole GPUs" in glance[0], glance
    assert glance[1].split()[:5] == ["failed", "crash", "root", "exit", "3"], glance
    assert glance[2].split()[:5] == ["completed", "done", "root", "exit", "0"], glance
    assert all(len(line) <= 80 for line in text.splitlines())
    doc = json.loads(ok(cgd, "status", "--json"))
    assert [(c["name"], c["state"]) for c in doc["components"]] == [
        ("big", "pending"), ("crash", "failed"), ("done", "completed")]
    assert "in use by root (component holder)" in doc["components"][0]["queue"]["reason"]


def test_allocate_wait_reconnects_across_a_kill_9_of_cgd_and_is_placed(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    ok(cgd, "allocate", "holder", "--gpus", "8", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    waiting = subprocess.Popen(
        [str(Path(sys.executable).parent / "cgctl"), "allocate", "later", "--gpus", "8", "--wait", "--",
         "sh", "-c", "echo ran"], env=cgd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "pending #1" in ok(cgd, "list"), "the claim queued")
    cgd.kill9()
    cgd.start()
    assert waiting.poll() is None, "cgctl keeps waiting while cgd is away"
    go.touch()
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and out.startswith("started later"), (out, err)
    ok(cgd, "wait", "later")
    assert (cgd.log_dir / "later" / "0.out").read_text() == "ran\n"


def test_a_queued_claim_survives_a_reboot(start_cgd, tmp_path: Path) -> None:
    """cgd starts and finds none of the recorded workers: the holder starts again by its policy and
    the claim behind it is still queued, and runs once the holder is done."""
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    ok(cgd, "allocate", "holder", "--gpus", "8", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    ok(cgd, "allocate", "later", "--gpus", "8", "--detach", "--", "sh", "-c", "echo ran")
    wait_for(lambda: cgd.worker_pids(), "the holder running")
    cgd.kill9()
    for pid in cgd.worker_pids():
        os.kill(pid, 9)
    wait_for(lambda: not cgd.worker_pids(), "nothing of the last boot runs")
    cgd.start()
    listed = json.loads(ok(cgd, "list", "--json"))["components"]
    states = {c["name"]: c["state"] for c in listed}
    assert states == {"holder": "running", "later": "pending"}, listed
    go.touch()
    ok(cgd, "wait", "later", "--timeout", "20s")
    assert (cgd.log_dir / "later" / "0.out").read_text() == "ran\n"


def test_a_finished_jobs_group_stays_while_a_sharer_uses_it(cgd: Cgd, tmp_path: Path) -> None:
    base_go, side_go = tmp_path / "base-go", tmp_path / "side-go"
    ok(cgd, "allocate", "base", "--gpus", "1", "--", "sh", "-c", f"while [ ! -e {base_go} ]; do sleep 0.02; done")
    ok(cgd, "allocate", "side", "--share-with", "base", "--", "sh", "-c",
       f"while [ ! -e {side_go} ]; do sleep 0.02; done")
    base_go.touch()
    ok(cgd, "wait", "base")
    groups = json.loads(ok(cgd, "status", "--json"))["gpus"]
    held = [g for g in groups if g["groups"]]
    assert [(g["groups"], g["components"]) for g in held] == [(["base-0"], ["side"])], held
    assert cgd.cgctl("allocate", "whole-box", "--gpus", "8").returncode == 1  # one GPU is still the sharer's
    side_go.touch()
    ok(cgd, "wait", "side")
    assert not [g for g in json.loads(ok(cgd, "status", "--json"))["gpus"] if g["groups"]]
    ok(cgd, "allocate", "whole-box", "--gpus", "8")


@pytest.mark.parametrize("width", [200, 60])
def test_release_shows_what_it_waits_for_on_a_terminal(cgd: Cgd, width: int) -> None:
    stubborn = "trap '' TERM; echo ready; while :; do sleep 0.05; done"
    ok(cgd, "allocate", "stubborn", "--gpus", "1", "--", "sh", "-c", stubborn)
    wait_for(lambda: (cgd.log_dir / "stubborn" / "0.out").read_text() == "ready\n", "the worker up")
    (pid,) = json.loads(ok(cgd, "list", "--json"))["components"][0]["replicas"][0]["pids"]
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "cgctl"), "release", "stubborn",
                               "--stop-timeout", "1.5s"], env=cgd.env(), stdout=subprocess.PIPE,
                              stderr=terminal, text=True, timeout=30)
        os.close(terminal)
        shown = b""
        while chunk := _read_some(main):
            shown += chunk
    finally:
        os.close(main)
    assert done.returncode == 0 and done.stdout.startswith("released stubborn"), done
    text = shown.decode()
    assert text.endswith("\r\x1b[K") and "stopping stubborn: waiting for" in text, text
    assert all(len(line) < width for line in text.split("\r")), "redrawn in place, never wider than the terminal"
    if width == 200:
        assert f"stopping stubborn: waiting for 1 worker (pid {pid}) to exit" in text, text
        assert "of 1.5s before SIGKILL" in text, text


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the terminal's other end is closed and everything was read
        return b""
