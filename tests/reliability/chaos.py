"""Clients that allocate, scale, shadow and release at random, and a monkey
that kills workers and cgd itself meanwhile.

Everything is seeded (one `random.Random` per thread, derived from the
test's seed) and bounded (a fixed number of operations per client, a fixed
number of kills per round), so a failing round can be replayed with its seed.
Requests go through `Cgd.request`, on the Unix socket only.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.daemon_fixture import Cgd
from tests.reliability.invariants import Ledger

WORKER = [sys.executable, "-c", (
    "import signal, subprocess, sys, time\nsignal.signal(signal.SIGUSR1, lambda *_: None)\n"
    "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(3600)'])\n"
    "while True: time.sleep(3600)")]
"""A worker written for cgd: a promotion signal does not end it once it runs (docs/configuration.md).
It forks a child that leaves its process group, as a data loader or a server's helper might: when the
worker is killed, released or restarted, nothing of it may be left (the invariants check)."""
RESTART = {"max_retries": 1000, "backoff_s": 0.02}
SHARES_MIB = (4096, 10240, 20480, 40960)


class NotSent(Exception):
    """cgd was down: the request never reached it, so nothing changed."""


@dataclass
class Outcome:
    """What one round's clients saw, for the test's own assertions."""

    answers: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    lost_answers: int = 0
    not_sent: int = 0


def send(cgd: Cgd, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request; raises NotSent when nothing listened, ConnectionError when the answer was lost."""
    try:
        return cgd.request(method, path, body, timeout=20.0)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise NotSent(str(exc)) from None
    except (http.client.HTTPException, OSError) as exc:
        raise ConnectionError(str(exc)) from None


class Client(threading.Thread):
    """One user's script for one round: `ops` random operations on the
    components named after it (those of earlier rounds included)."""

    def __init__(self, cgd: Cgd, ledger: Ledger, lock: threading.Lock, outcome: Outcome,
                 ident: str, seed: int, ops: int, round_no: int) -> None:
        super().__init__(name=f"client-{ident}-round-{round_no}", daemon=True)
        self.cgd, self.ledger, self.lock, self.outcome = cgd, ledger, lock, outcome
        self.prefix = ident
        self.rng = random.Random(seed)
        self.ops = ops
        self.round_no = round_no
        self.serial = 0

    def mine(self) -> list[str]:
        with self.lock:
            return sorted(n for n in self.ledger.replicas if n.startswith(f"{self.prefix}-"))

    def run(self) -> None:
        for _ in range(self.ops):
            crowded = len(self.mine()) > 4
            action = self.rng.choices(["allocate", "scale", "shadow", "release"], [2 if crowded else 4, 2, 1,
                                                                                  4 if crowded else 2])[0]
            try:
                getattr(self, action)()
            except NotSent:
                with self.lock:
                    self.outcome.not_sent += 1
                time.sleep(0.05)
            time.sleep(self.rng.uniform(0, 0.03))

    def request(self, names: list[str], method: str, path: str, body: Any = None) -> tuple[int, Any] | None:
        """Send, record the answer; a lost answer makes `names` uncertain and returns None."""
        try:
            status, reply = send(self.cgd, method, path, body)
        except ConnectionError:
            with self.lock:
                self.outcome.lost_answers += 1
                for name in names:
                    self.ledger.unknown(name)
            return None
        with self.lock:
            self.outcome.answers[status] = self.outcome.answers.get(status, 0) + 1
            if status >= 500:
                self.outcome.server_errors.append(f"{method} {path} {body} -> {status} {reply}")
        return status, reply

    def allocate(self) -> None:
        self.serial += 1
        name = f"{self.prefix}-{self.round_no}-{self.serial}"
        replicas = self.rng.choice([1, 1, 2])
        claim: dict[str, Any] = ({"gpus": 1} if self.rng.random() < 0.25
                                 else {"memory_mib": self.rng.choice(SHARES_MIB)})
        body: dict[str, Any] = {"name": name, "claim": claim, "replicas": replicas,
                                "restart": RESTART, "stop_timeout_s": 2}
        if self.rng.random() < 0.85:
            body["command"] = WORKER
        answer = self.request([name], "POST", "/v1/components", body)
        if answer is None:
            return
        with self.lock:
            if answer[0] == 201:
                self.ledger.created(name, replicas)
            elif answer[0] < 500:
                self.ledger.refused(name)

    def scale(self) -> None:
        names = [n for n in self.mine() if not n.endswith("-s")]
        if not names:
            return
        name = self.rng.choice(names)
        replicas = self.rng.choice([0, 1, 2, 3])
        answer = self.request([name, f"{name}-s"], "POST", f"/v1/components/{name}/scale", {"replicas": replicas})
        if answer is not None and answer[0] == 200:
            with self.lock:
                self.ledger.replicas[name] = replicas

    def shadow(self) -> None:
        with self.lock:
            taken = set(self.ledger.replicas) | self.ledger.uncertain
        names = [n for n in self.mine() if not n.endswith("-s") and f"{n}-s" not in taken]
        if not names:
            return
        primary = self.rng.choice(names)
        name = f"{primary}-s"
        body = {"name": name, "shadow_of": primary, "command": WORKER, "restart": RESTART, "stop_timeout_s": 2}
        answer = self.request([name], "POST", "/v1/components", body)
        if answer is None:
            return
        with self.lock:
            if answer[0] == 201:
                self.ledger.created(name, None)
            elif answer[0] < 500:
                self.ledger.refused(name)

    def release(self) -> None:
        names = self.mine()
        if not names:
            return
        name = self.rng.choice(names)
        answer = self.request([name, f"{name}-s"], "DELETE", f"/v1/components/{name}")
        if answer is not None and answer[0] == 200:
            with self.lock:
                self.ledger.released(answer[1]["released"])


class Monkey(threading.Thread):
    """Kills `worker_kills` random workers and, `cgd_kills` times, cgd itself
    (SIGKILL, then a start on the same state after a random pause)."""

    def __init__(self, cgd: Cgd, seed: int, duration: float, worker_kills: int, cgd_kills: int) -> None:
        super().__init__(name="monkey", daemon=True)
        self.cgd = cgd
        self.rng = random.Random(seed)
        self.duration = duration
        self.plan = sorted([(self.rng.uniform(0, duration), "worker") for _ in range(worker_kills)]
                           + [(self.rng.uniform(0, duration), "cgd") for _ in range(cgd_kills)])
        self.error: Exception | None = None
        self.killed_workers = 0

    def run(self) -> None:
        begin = time.monotonic()
        try:
            for at, what in self.plan:
                time.sleep(max(0.0, begin + at - time.monotonic()))
                if what == "cgd":
                    self.cgd.kill9()
                    time.sleep(self.rng.uniform(0, 0.3))
                    self.cgd.start()
                else:
                    self.kill_worker()
        except Exception as exc:  # the test re-raises it in the main thread
            self.error = exc

    def kill_worker(self) -> None:
        pids = sorted(self.cgd.worker_pids())
        if not pids:
            return
        try:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            self.killed_workers += 1
        except ProcessLookupError:
            pass
