"""`cgctl install-service`: a systemd unit for cgd, system-wide or per user.

The unit text is generated here: it is `contrib/computegroups.service` or
`contrib/computegroups-user.service` (without their install comments, and
tests/cli/test_service.py keeps them equal) with ExecStart pointing at the
cgd actually installed, a virtualenv's often, because `contrib/` is not
shipped inside the package and the paths there are only the usual ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from computegroups.cli.connect import emit_json, emit_lines, fail, json_wanted

UNIT_NAME = "computegroups.service"

SYSTEM_UNIT = """\
[Unit]
Description=computegroups GPU supervisor (cgd)
After=network.target nvidia-persistenced.service

[Service]
Type=notify
# Only cgd itself sends READY=1 / WATCHDOG=1, not its workers.
NotifyAccess=main
EnvironmentFile=-/etc/default/computegroups
ExecStart={cgd} $CGD_OPTS
# Stop signals go to cgd alone: it stops its workers gracefully itself, or
# leaves them running for the next cgd (--keep-workers). With the default
# control-group mode systemd would kill every worker at once.
KillMode=process
# cgd may create a cgroup per worker under its own (see docs/configuration.md).
Delegate=yes
# cgd runs in a leaf of that cgroup, so the workers' cgroups beside it can
# count memory (systemd 254 and later; older ones log once and ignore it).
DelegateSubgroup=cgd
KillSignal=SIGTERM
# Room for workers' stop timeouts (10 s each by default, stopped in parallel).
TimeoutStopSec=90
WatchdogSec=30
Restart=on-failure
RestartSec=2
# /run/computegroups holds the socket, circus's private endpoints, role files
# and the MPS pipes of running workers: it must outlive a restart of cgd.
RuntimeDirectory=computegroups
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=yes
StateDirectory=computegroups
StateDirectoryMode=0700
LogsDirectory=computegroups
LogsDirectoryMode=0755
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
"""

USER_UNIT = """\
[Unit]
Description=computegroups GPU supervisor (cgd, per user)

[Service]
Type=notify
NotifyAccess=main
EnvironmentFile=-%h/.config/computegroups/cgd.env
ExecStart={cgd} $CGD_OPTS
# cgd stops its workers itself, or leaves them for the next cgd.
KillMode=process
# cgd may create a cgroup per worker under its own (see docs/configuration.md).
Delegate=yes
# cgd runs in a leaf of that cgroup, so the workers' cgroups beside it can
# count memory (systemd 254 and later; older ones log once and ignore it).
DelegateSubgroup=cgd
TimeoutStopSec=90
WatchdogSec=30
Restart=on-failure
RestartSec=2
LimitNOFILE=65536

[Install]
WantedBy=default.target
"""


def find_cgd() -> str:
    """The cgd beside this cgctl (same virtualenv) before the one on PATH."""
    beside = Path(sys.executable).parent / "cgd"
    if beside.exists():
        return str(beside)
    found = shutil.which("cgd")
    if found is None:
        fail("cgd is not installed next to cgctl nor on PATH: pip install computegroups")
    return found


def unit_path(user: bool) -> Path:
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def unit_text(user: bool, cgd: str) -> str:
    return (USER_UNIT if user else SYSTEM_UNIT).format(cgd=cgd)


def systemctl_commands(user: bool) -> list[list[str]]:
    base = ["systemctl", "--user"] if user else ["systemctl"]
    return [[*base, "daemon-reload"], [*base, "enable", "--now", "computegroups"]]


def shown(argv: list[str], user: bool) -> str:
    """As the user should type it: a system unit is managed with sudo."""
    return " ".join(argv if user else ["sudo", *argv])


@click.command(name="install-service")
@click.option("--user", is_flag=True, help="A user unit (~/.config/systemd/user) instead of a system one.")
@click.option("--print", "print_only", is_flag=True, help="Only print the unit; write nothing.")
@click.option("--now", is_flag=True, help="Also run systemctl daemon-reload and enable --now.")
def install_service(user: bool, print_only: bool, now: bool) -> None:
    """Write the systemd unit that runs cgd, then say how to start it."""
    text = unit_text(user, find_cgd())
    if print_only:
        click.echo(text, nl=False)
        return
    path = unit_path(user)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except PermissionError:
        fail(f"cannot write {path}: run it with sudo, or use --user for a unit of your own")
    commands = systemctl_commands(user)
    if now:
        for argv in commands:
            if subprocess.run(argv, check=False).returncode != 0:
                fail(f"`{' '.join(argv)}` failed: see its message above")
    steps = [shown(argv, user) for argv in commands]
    if json_wanted():
        emit_json({"path": str(path), "user": user, "started": now, "commands": steps})
        return
    lines = [f"wrote {path}; computegroups is enabled and started"] if now else \
        [f"wrote {path}; now run:", *(f"  {step}" for step in steps)]
    if user:
        lines.append('to keep it running after you log out: loginctl enable-linger "$USER"')
    emit_lines(lines)
