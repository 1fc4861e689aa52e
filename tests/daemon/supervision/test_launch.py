"""The launch shim on its own: its spec format, and what its start-up costs.

The shim is the first program of every worker, run as root by
`python -I -S`: it must start with the standard library alone, and with only
the modules that cost nothing to import (see daemon/supervision/launch.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from computegroups.daemon.supervision import launch
from computegroups.daemon.supervision.launch import LaunchSpec, compile_shim, read_status, shim_argv, write_spec

COSTLY = {"site", "enum", "re", "json", "typing", "dataclasses", "inspect", "collections"}
"""Standard modules the shim must not load: each costs about as much as the rest of its start-up."""


def spec_in(tmp_path: Path, argv: tuple[str, ...], **env: str) -> LaunchSpec:
    return LaunchSpec(argv=argv, env={"PATH": "/usr/bin:/bin", **env}, uid=os.getuid(), gid=os.getgid(),
                      stdout=str(tmp_path / "out.log"), stderr=str(tmp_path / "err.log"), cwd=str(tmp_path))


def test_a_spec_reads_back_as_written(tmp_path: Path) -> None:
    spec = LaunchSpec(argv=("prog", "", "a b", "x=y", "naïve", "\udcff raw byte"),
                      env={"EMPTY": "", "ODD": "= and 'quotes' and $(circus.env.path)", "UNI": "ü\udcfe"},
                      uid=1000, gid=100, stdout="/logs/0.out", stderr="/logs/0.err", cwd=None)
    write_spec(str(tmp_path / "x.spec"), spec)
    again = LaunchSpec.decode((tmp_path / "x.spec").read_bytes())
    assert again == spec and again.cwd is None
    assert LaunchSpec.decode(spec.encode()) == spec
    assert LaunchSpec.decode(spec_in(tmp_path, ("true",)).encode()).cwd == str(tmp_path)
    assert LaunchSpec.decode(LaunchSpec(argv=("a",), env={}, uid=0, gid=0, stdout="o", stderr="e",
                                        status="/run/w.status").encode()).status == "/run/w.status"
    with_cgroup = LaunchSpec(argv=("a",), env={}, uid=0, gid=0, stdout="o", stderr="e", cgroup="/sys/fs/cgroup/w")
    assert LaunchSpec.decode(with_cgroup.encode()) == with_cgroup and spec.cgroup is None


@pytest.mark.parametrize(("spec", "problem"), [
    (LaunchSpec(argv=(), env={}, uid=0, gid=0, stdout="o", stderr="e"), "argv"),
    (LaunchSpec(argv=("a\0b",), env={}, uid=0, gid=0, stdout="o", stderr="e"), "NUL"),
    (LaunchSpec(argv=("a",), env={"K": "v\0"}, uid=0, gid=0, stdout="o", stderr="e"), "NUL"),
    (LaunchSpec(argv=("a",), env={"A=B": "v"}, uid=0, gid=0, stdout="o", stderr="e"), "'='"),
    (LaunchSpec(argv=("a",), env={"": "v"}, uid=0, gid=0, stdout="o", stderr="e"), "empty"),
])
def test_a_spec_that_cannot_be_written_is_refused(spec: LaunchSpec, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        spec.encode()


@pytest.mark.parametrize("data", [
    b"",
    b"cg-launch-1\x000\x000\x00o\x00e\x00\x001\x00true",
    b"cg-launch-2\x000\x000\x00o\x00e\x00\x00\x001\x00true",
    b"cg-launch-3\x000\x000\x00o\x00e\x00\x00\x00\x001\x00true",
    b"cg-launch-4\x000\x000\x00o\x00e\x00\x00\x00\x00\x002\x00true",
    b"cg-launch-4\x000\x000\x00o\x00e\x00\x00\x00\x00\x000\x00true",
    b"cg-launch-4\x00zero\x000\x00o\x00e\x00\x00\x00\x00\x001\x00true",
    b"cg-launch-4\x000\x000\x00o\x00e\x00\x00\x00\x00\x001\x00true\x00NOVALUE",
])
def test_a_damaged_spec_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        LaunchSpec.decode(data)


def test_circus_runs_the_compiled_shim_isolated_from_site_packages(tmp_path: Path) -> None:
    shim = compile_shim(str(tmp_path))
    assert Path(shim).parent == tmp_path and Path(shim).read_bytes()[:4] == importlib.util.MAGIC_NUMBER
    assert shim_argv(shim, "/run/x.spec") == [sys.executable, "-I", "-S", shim, "/run/x.spec"]


@pytest.mark.parametrize("program", ["compiled", "source"])
def test_the_shim_imports_only_cheap_standard_library_modules(tmp_path: Path, program: str) -> None:
    """Run as circus runs it (`-I -S`, an empty environment), with -X importtime:
    every module it imports is listed on its stderr before it execs the worker."""
    shim = compile_shim(str(tmp_path)) if program == "compiled" else launch.__file__
    spec = spec_in(tmp_path, ("sh", "-c", "echo ran $MARK", "sh"), MARK="here")
    spec.status = str(tmp_path / "w.status")  # as cgd runs it: the shim forks the worker and waits
    write_spec(str(tmp_path / "w.spec"), spec)
    done = subprocess.run([sys.executable, "-X", "importtime", *shim_argv(shim, str(tmp_path / "w.spec"))[1:]],
                          env={}, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.log").read_text() == "ran here\n"
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:") and "imported package" not in line}
    assert imported, done.stderr
    outside = sorted(m for m in imported if m.split(".")[0] not in sys.stdlib_module_names)
    assert not outside, f"the shim imports {outside}, outside the standard library"
    costly = sorted(imported & COSTLY)
    assert not costly, f"the shim imports {costly}: see daemon/supervision/launch.py on what it may import"


@pytest.mark.parametrize(("command", "code", "shim_exit"), [
    ("exit 3", 3, 3),
    ("kill -TERM $$", -15, -15),
    ("kill -SEGV $$", -11, 128 + 11),  # the shim does not leave a core of itself
])
def test_the_shim_writes_how_its_worker_ended_and_ends_the_same_way(
        tmp_path: Path, command: str, code: int, shim_exit: int) -> None:
    shim = compile_shim(str(tmp_path))
    spec = spec_in(tmp_path, ("sh", "-c", command))
    spec.status = str(tmp_path / "w.status")
    write_spec(str(tmp_path / "w.spec"), spec)
    proc = subprocess.Popen(shim_argv(shim, str(tmp_path / "w.spec")), env={})
    assert proc.wait(timeout=30) == shim_exit
    status = read_status(spec.status)
    assert status is not None and (status.shim, status.code) == (proc.pid, code) and status.worker != proc.pid


def test_a_status_file_is_read_only_when_whole(tmp_path: Path) -> None:
    path = tmp_path / "w.status"
    for data, expected in ((b"", None), (b"12 34", None), (b"12 x\n", None), (b"12 34\n", (12, 34, None)),
                           (b"12 34 -9\n", (12, 34, -9))):
        path.write_bytes(data)
        status = read_status(str(path))
        assert (None if status is None else (status.shim, status.worker, status.code)) == expected, data
    assert read_status(str(tmp_path / "missing")) is None


def test_the_shim_binds_its_worker_to_the_given_cpus(tmp_path: Path) -> None:
    one = min(os.sched_getaffinity(0))
    shim = compile_shim(str(tmp_path))
    spec = spec_in(tmp_path, (sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"))
    spec.cpus = (one,)
    assert LaunchSpec.decode(spec.encode()).cpus == (one,)
    spec.status = str(tmp_path / "w.status")
    write_spec(str(tmp_path / "w.spec"), spec)
    assert subprocess.Popen(shim_argv(shim, str(tmp_path / "w.spec")), env={}).wait(timeout=30) == 0
    assert (tmp_path / "out.log").read_text() == f"[{one}]\n"
