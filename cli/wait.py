"""`cgctl wait`, and the waiting `allocate --wait` and `run --wait` do: long polls that outlast a restart of cgd.

Each poll is one request that cgd answers as soon as the component is
placed or has ended (or after `POLL_S`), so waiting costs no busy loop. A
refused connection while cgd restarts is asked again: the queue and the
jobs are in its state file, so the wait goes on where it was.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import click

from computegroups.cli.connect import client, complete_components, emit_json, fail, json_wanted, talking
from computegroups.cli.options import FOREVER, NAME, DurationType
from computegroups.cli.render import wrap
from computegroups.cli.terminal import columns
from computegroups.daemon.client.errors import CgdUnreachable, ClientError
from computegroups.daemon.client.sync import CgdClient

POLL_S = 30.0
"""One long poll: well inside the client's socket timeout."""
RECONNECT_S = 0.2


def wait_until(cgd: CgdClient, name: str, until: str, timeout: float | None) -> dict[str, Any] | None:
    """The component once `until` ("placed" or "ended") holds; None when `timeout` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
        if left <= 0:
            return None
        try:
            answer = cgd.wait_component(name, until, left)
        except CgdUnreachable:
            time.sleep(RECONNECT_S)
            continue
        except ClientError as exc:
            fail(str(exc))
        if answer["reached"]:
            return dict(answer["component"])


def queued_lines(component: dict[str, Any], width: int, then: str = "") -> list[str]:
    """`queued NAME: position N (why it does not fit)` and `then`, wrapped to `width` columns:
    cgd's reason names everyone in the way, often longer than a terminal is wide."""
    queue = component.get("queue") or {}
    text = (f"queued {component['name']}: position {queue.get('position', '?')} "
            f"({queue.get('reason') or 'waiting for capacity'}){then}")
    return wrap(text, width)


def exit_code(component: dict[str, Any]) -> int:
    code = component.get("exit_code")
    return 1 if code is None else int(code)


def wait_timeout(wait: str | None, detach: bool) -> float | None:
    """`--wait` alone waits as long as it takes; `--wait 10m` gives up after that."""
    if detach and wait is not None:
        raise click.UsageError("--detach returns at once; leave out --wait")
    if wait in (None, FOREVER):
        return None
    return DurationType().convert(wait, None, None)


def wait_for_place(cgd: CgdClient, component: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Block like salloc until the queued claim is placed; on a timeout or ^C the claim is withdrawn."""
    name = component["name"]
    click.echo("\n".join(queued_lines(component, columns(), "; waiting (^C gives up)")), err=True)
    placed = None
    try:
        placed = wait_until(cgd, name, "placed", timeout)
    finally:
        if placed is None:
            with contextlib.suppress(ClientError):
                cgd.release_component(name)
    if placed is None:
        fail(f"{name} was not placed within {timeout:g}s; its claim is withdrawn")
    return placed



@click.command()
@click.argument("name", type=NAME, shell_complete=complete_components)
@click.option("--timeout", type=DurationType(), metavar="DURATION",
              help="Give up after this long (90s, 10m, 2h) and exit 1; the job goes on.")
def wait(name: str, timeout: float | None) -> None:
    """Wait until component NAME has ended, and exit with its exit code.

    The first non-zero exit code of its replicas, 128+N for a signal N, 124
    when it reached its time limit: scripts can chain jobs like
    `cgctl wait prep && cgctl allocate train ...`.
    """
    cgd = client()
    with talking():
        cgd.get_component(name)  # a typo is "no component", at once
    ended = wait_until(cgd, name, "ended", timeout)
    if ended is None:
        fail(f"{name} has not ended after {timeout:g}s; it goes on (`cgctl list` shows it)")
    if json_wanted():
        emit_json(ended)
    else:
        code = exit_code(ended)
        took = f" after {ended['duration_s']:.1f}s" if ended.get("duration_s") is not None else ""
        click.echo(f"{name} {ended['state']}{took} (exit code {code})")
    sys.exit(exit_code(ended))
