"""The private parts of circus that daemon/supervision/arbiter.py and
supervisor.py rely on, checked against the installed circus.

arbiter.py overrides `Arbiter._init_context` and `Controller._init_syshandler`
and awaits `Watcher._start`; supervisor.py calls `Watcher.reap_process` and
reads `Watcher.processes`. None of these is public API: a circus release may
rename or reshape them without notice, and then cgd would, for instance,
quietly install circus's signal handlers again. These tests fail first, with
the hook named, so that a circus upgrade is a deliberate change of the pin
in setup.cfg.
"""

from __future__ import annotations

import asyncio
import configparser
import inspect
import re
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from circus.arbiter import Arbiter
from circus.controller import Controller
from circus.process import Process
from circus.watcher import Watcher
from packaging.requirements import Requirement
from tornado import gen

from computegroups.daemon.supervision.arbiter import LoopArbiter, _Controller, _NoSignals

ROOT = Path(__file__).resolve().parents[3]


def _parameters(function: Callable[..., object]) -> list[str]:
    return list(inspect.signature(function).parameters)


def _circus_requirement() -> Requirement:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    found = [Requirement(line) for line in lines if re.match(r"circus\b", line.strip())]
    assert len(found) == 1, f"setup.cfg should require circus once, found {found}"
    return found[0]


def test_the_installed_circus_is_within_the_pinned_range() -> None:
    requirement = _circus_requirement()
    assert requirement.specifier, "circus must be pinned to the versions whose private hooks were checked"
    assert requirement.specifier.contains(version("circus")), (requirement, version("circus"))


def test_the_arbiter_builds_its_controller_in_init_context() -> None:
    """`_Arbiter._init_context` replaces the stock one to build our controller:
    circus must still call it from `__init__`, with the context, and the
    stock version must still build the controller from these attributes."""
    assert _parameters(Arbiter._init_context) == ["self", "context"]
    assert "self._init_context(context)" in inspect.getsource(Arbiter.__init__)
    stock = inspect.getsource(Arbiter._init_context)
    assert "self._ensure_ioloop()" in stock
    assert re.search(r"Controller\(self\.endpoint,\s*self\.multicast_endpoint,\s*self\.context,\s*self\.loop,"
                     r"\s*self,\s*self\.check_delay,\s*self\.endpoint_owner\)", stock), stock
    assert _parameters(Arbiter._ensure_ioloop) == ["self"]
    assert _parameters(Controller.__init__) == [
        "self", "endpoint", "multicast_endpoint", "context", "loop", "arbiter", "check_delay", "endpoint_owner"]


def test_the_controller_installs_its_signal_handlers_through_init_syshandler() -> None:
    """`_Controller._init_syshandler` keeps circus's SIGTERM handler out of cgd:
    circus must still install the handlers there and only stop them later."""
    assert _parameters(Controller._init_syshandler) == ["self"]
    assert "self._init_syshandler()" in inspect.getsource(Controller.__init__)
    source = inspect.getsource(Controller)
    uses = re.findall(r"self\.sys_hdl\.(\w+)", source)
    assert uses and set(uses) == {"stop"}, uses


def test_watcher_start_is_the_unlocked_coroutine() -> None:
    """arbiter.py awaits `_start` (circus's `start` takes the global command lock)."""
    assert _parameters(Watcher._start) == ["self"]
    assert gen.is_coroutine_function(Watcher._start)
    assert "self._start()" in inspect.getsource(Watcher.start)


def test_watcher_reaps_one_pid_and_keeps_processes_by_pid() -> None:
    assert _parameters(Watcher.reap_process) == ["self", "pid", "status"]
    assert inspect.signature(Watcher.reap_process).parameters["status"].default is None
    watcher = Watcher("hooks", "true")
    assert watcher.processes == {}
    assert _parameters(Process.poll) == ["self"]


def test_the_public_arbiter_calls_keep_their_shape() -> None:
    assert _parameters(Arbiter.add_watcher) == ["self", "name", "cmd", "kw"]
    assert _parameters(Arbiter.rm_watcher) == ["self", "name", "nostop"]
    assert _parameters(Arbiter.stop_controller_and_close_sockets) == ["self"]
    assert isinstance(inspect.getattr_static(Arbiter, "running"), property)
    for name in ("endpoint", "multicast_endpoint", "check_delay", "endpoint_owner", "loop", "context"):
        assert f"self.{name} =" in inspect.getsource(Arbiter), name


def test_loop_arbiter_gets_our_controller_without_signal_handlers(tmp_path: Path) -> None:
    """The hooks above, end to end: the arbiter cgd builds has our controller,
    with no signal handlers, on the running loop, and closes cleanly."""

    async def build() -> None:
        arbiter = LoopArbiter(tmp_path)
        try:
            inner = arbiter._arbiter
            assert isinstance(inner.ctrl, _Controller)
            assert isinstance(inner.ctrl.sys_hdl, _NoSignals)
            assert inner.check_delay == 0
            assert inner.ctrl.context is inner.context
        finally:
            arbiter.close()

    asyncio.run(build())
