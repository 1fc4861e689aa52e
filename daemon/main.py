"""`cgd`: read top to bottom, it is the daemon's whole life.

Load the machine and the state, take over the workers a previous run left,
serve until told to stop, then stop workers (or leave them for the next cgd)
and go. Signal handlers only set a flag; the loop does the work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from pathlib import Path
from typing import ClassVar, NoReturn

import click

from computegroups.daemon import paths
from computegroups.daemon.model.config import ConfigError, load_config, parse_config

log = logging.getLogger("cgd")

EXIT_STARTUP_FAILURE = 3
NOFILE_TARGET = 65536


class JournalFormatter(logging.Formatter):
    """Priority prefixes journald understands; plain timestamps elsewhere."""

    PRIORITY: ClassVar[dict[int, int]] = {
        logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2,
    }

    def __init__(self, journald: bool) -> None:
        fmt = "%(name)s: %(message)s" if journald else "%(asctime)s %(levelname)s %(name)s: %(message)s"
        super().__init__(fmt)
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.journald:
            return f"<{self.PRIORITY.get(record.levelno, 6)}>{text}"
        return text


def raise_nofile_limit(target: int = NOFILE_TARGET) -> None:
    """Lift the soft descriptor limit to the hard one (at most `target`).

    Every worker's pipes and every client connection cost cgd descriptors, and
    the usual soft default of 1024 runs out long before the hard limit does.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-files limit from %d to %d: %s", soft, wanted, exc)


def setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JournalFormatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("circus", "tornado.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_", type=click.Path(), help="Unix socket to serve on.")
@click.option("--state-dir", type=click.Path(), envvar="CG_STATE_DIR", help="Where the state files live.")
@click.option("--log-dir", type=click.Path(), help="Where worker logs go.")
@click.option("--config", "config_path", type=click.Path(), help="TOML configuration file.")
@click.option("--simulate", envvar="CG_SIMULATE", metavar="NAME|PATH", help="Run on a simulated machine.")
@click.option("--simulate-fallback", metavar="NAME|PATH",
              help="Use this simulated machine only when no NVIDIA driver is found.")
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="Also serve /metrics on this TCP address for Prometheus (e.g. 127.0.0.1:9404).")
@click.option("--keep-workers", is_flag=True, help="On SIGTERM leave workers running for the next cgd.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="computegroups", prog_name="cgd")
def main(socket_, state_dir, log_dir, config_path, simulate, simulate_fallback, metrics_listen, keep_workers,
         verbose) -> None:
    """Run the computegroups daemon in the foreground."""
    from computegroups.daemon.api.listener import SocketInUse, refuse_live_socket
    from computegroups.daemon.lifecycle import Options, StartupError
    from computegroups.statefiles.paths import default_state_dir

    setup_logging(verbose)
    raise_nofile_limit()
    system = paths.is_system_mode()
    try:
        config = load_config(config_path)
        if metrics_listen is not None:
            parse_config({"metrics_listen": metrics_listen}, "--metrics-listen")
    except ConfigError as exc:
        _fail(str(exc))
    sock = paths.socket_path(socket_, system)
    opts = Options(
        socket=sock,
        state_dir=Path(state_dir) if state_dir else default_state_dir(system),
        log_dir=paths.log_dir(log_dir, system),
        runtime_dir=sock.parent,
        config=config,
        simulate=simulate,
        simulate_fallback=simulate_fallback,
        keep_workers=keep_workers,
        system=system,
        metrics_listen=metrics_listen,
    )
    try:
        # Checked before anything starts: the workers of a second state
        # directory must not run beside a live cgd on the same socket.
        refuse_live_socket(sock)
        code = asyncio.run(_run(opts))
    except (StartupError, SocketInUse) as exc:
        _fail(str(exc))
    sys.exit(code)


def _fail(message: str) -> NoReturn:
    click.echo(f"cgd: error: {message}", err=True)
    sys.exit(EXIT_STARTUP_FAILURE)


async def _run(opts) -> int:
    from computegroups.daemon.lifecycle import Daemon

    daemon = Daemon(opts)
    await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await daemon.stop()
    return 0
