"""systemd's readiness and watchdog protocol (sd_notify(3)), without libsystemd.

The protocol is one datagram of `KEY=VALUE` lines to the socket named by
`$NOTIFY_SOCKET`; a name starting with '@' is an abstract socket. Outside
systemd the variable is unset and every call is a cheap no-op, so cgd calls
these unconditionally.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1", "STOPPING=1", "WATCHDOG=1",
    "STATUS=serving 3 workers", or several joined by newlines).
    True if systemd got it; False outside systemd or if sending failed, which
    must never stop the daemon."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or address[0] not in "/@":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), target)
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """The unit's WatchdogSec in seconds, or None when systemd does not
    watch this process (no WATCHDOG_USEC, or WATCHDOG_PID names another
    process, such as a wrapper that exec'd us with a stale environment).
    Send WATCHDOG=1 at least twice per interval, as sd_watchdog_enabled(3)
    advises: a ping that comes just late gets the daemon killed."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    try:
        if pid and int(pid) != os.getpid():
            return None
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return value / 1_000_000
