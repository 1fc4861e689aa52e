"""`cgctl run`: allocate, run a command in the foreground, release.

The command is cgctl's own child, not a cgd worker: it keeps the terminal,
the user's environment and the current directory, and its exit status is
cgctl's. The allocation is a lease (`"lease": true`), so cgd frees it even
when cgctl is killed with SIGKILL and never reaches its own release.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import click

from computegroups.cli.connect import client, talking
from computegroups.cli.options import FOREVER, attach_options, build_component, claim_options, process_options
from computegroups.cli.render import component_text
from computegroups.cli.wait import wait_for_place, wait_timeout
from computegroups.daemon.client.errors import ClientError
from computegroups.daemon.client.sync import CgdClient

# Signals a user or a supervisor sends to stop "the program": passed to CMD.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SHELL_OWNED = frozenset({"PATH", "HOME", "USER", "LANG"})
SI_KERNEL = 0x80  # si_code of signals the kernel raises itself, e.g. a terminal's Ctrl-C
WAIT_S = 0.5


@click.command()
@click.option("--name", help="The component's name (default: run-PID).")
@claim_options
@attach_options
@process_options
@click.option("--wait", "wait", is_flag=False, flag_value=FOREVER, default=None, metavar="[TIMEOUT]",
              help="If it does not fit now, wait in the queue for its turn; a TIMEOUT (10m, 2h) gives up.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS...]")
def run(name: str | None, command: tuple[str, ...], explain: bool, cwd: str | None, wait: str | None,
        **opts: Any) -> None:
    """Allocate, run CMD in the foreground with the devices, release on exit.

    Exits with CMD's status (128+N when a signal N ended it). SIGINT,
    SIGTERM, SIGHUP and SIGQUIT sent to cgctl are passed on to CMD. CMD is
    never restarted: it is cgctl's own child.
    """
    name = name or f"run-{os.getpid()}"
    timeout = wait_timeout(wait, detach=False)
    body = build_component(name, opts, lease=True)
    if wait is not None:
        body["wait"] = True
    cgd = client()
    with talking():
        component = cgd.create_component(body)
    if component.get("state") == "pending":
        component = wait_for_place(cgd, component, timeout)
    with _signals_held() as previous:
        try:
            if explain:
                click.echo("\n".join(component_text(component, "allocated", explain=True)), err=True)
            with talking():
                worker_env = cgd.component_env(name, 0)["env"]
            env = child_env(os.environ, worker_env, dict(opts.get("env") or ()))
            code = run_child(command, env, cwd, previous)
        finally:
            _release(cgd, name)
    click.get_current_context().exit(code)


@contextmanager
def _signals_held() -> Iterator[set[int | signal.Signals]]:
    """From the allocation to its release no stop signal can cut cgctl short;
    they are taken by `run_child` and passed on. Those still pending at the
    end were meant for CMD and are dropped. Yields the mask to restore."""
    watched = {*FORWARDED, signal.SIGCHLD}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        yield previous
    finally:
        while signal.sigtimedwait(watched, 0) is not None:
            continue
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def child_env(current: Mapping[str, str], worker: Mapping[str, str],
              extra: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment with cgd's worker variables over it.

    cgd's variables win (CUDA_VISIBLE_DEVICES must be the allocation's, not
    a stale one), except those it derives from the password database for
    the workers it starts itself (PATH, HOME, USER, LANG): CMD is started
    from the user's shell, whose values are the right ones. `--env` wins last.
    """
    env = dict(current)
    env.update({k: v for k, v in worker.items() if k not in SHELL_OWNED})
    env.update(extra)
    return env


def run_child(argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              child_mask: set[int | signal.Signals]) -> int:
    """Run argv to its end, passing on the stop signals cgctl receives.

    The caller holds the signals blocked; they are taken here with
    sigtimedwait, so none is lost between the spawn and the wait, and each
    one's origin is known: a terminal's Ctrl-C (raised by the kernel for the
    whole foreground group) already reached CMD and is not sent twice.
    """
    try:
        # preexec_fn is safe here: cgctl runs no threads. It is the only way
        # to start CMD with the stop signals unblocked without a window in
        # which cgctl could die of one before passing it on.
        child = subprocess.Popen(
            list(argv), env=dict(env), cwd=cwd,
            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, child_mask),
        )
    except OSError as exc:
        click.echo(f"cgctl: error: cannot run {argv[0]!r}: {exc.strerror}", err=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    watched = {*FORWARDED, signal.SIGCHLD}
    while child.poll() is None:
        info = signal.sigtimedwait(watched, WAIT_S)
        if info is None or info.si_signo == signal.SIGCHLD or info.si_code == SI_KERNEL:
            continue
        child.send_signal(info.si_signo)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _release(cgd: CgdClient, name: str) -> None:
    """Release, but never hide CMD's status behind a release failure: the
    lease frees the allocation anyway when cgctl exits."""
    try:
        cgd.release_component(name)
    except ClientError as exc:
        click.echo(f"cgctl: warning: could not release {name}: {exc}", err=True)
