"""Validation of what callers send, before anything is decided.

Every body the API accepts is checked here field by field, with unknown keys
refused, so the manager only ever sees well-formed requests and a rejected
request can not have changed anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from computegroups.daemon.model.claims import Claim, ClaimError

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
SCOPES = ("per-replica", "all-replicas")
RESERVED_ENV_PREFIXES = ("CG_", "CUDA_")
MAX_REPLICAS = 1024


class RequestError(ValueError):
    """A request is malformed; the message names the field."""


def check_name(value: Any, path: str = "name") -> str:
    if not isinstance(value, str):
        raise RequestError(f"{path}: expected a string")
    if not NAME_RE.fullmatch(value):
        raise RequestError(
            f"{path}: {value[:80]!r} is not a valid name: use 1-63 lowercase letters, "
            "digits and '-', starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class RestartSpec:
    max_retries: int = 5
    backoff_s: float = 1.0


@dataclass(frozen=True)
class ComponentRequest:
    name: str
    claim: Claim | None = None
    replicas: int = 1
    scope: str = "per-replica"
    share_with: str | None = None
    shadow_of: str | None = None
    command: tuple[str, ...] | None = None
    shell: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    restart: RestartSpec = RestartSpec()
    stop_timeout_s: float = 10.0
    lease: bool = False

    def to_spec(self) -> dict[str, Any]:
        """The form kept in the state file (the lease lives on the record)."""
        return {
            "claim": self.claim.to_dict() if self.claim else None,
            "replicas": self.replicas,
            "scope": self.scope,
            "share_with": self.share_with,
            "shadow_of": self.shadow_of,
            "command": list(self.command) if self.command is not None else None,
            "shell": self.shell,
            "env": dict(self.env),
            "cwd": self.cwd,
            "restart": {"max_retries": self.restart.max_retries, "backoff_s": self.restart.backoff_s},
            "stop_timeout_s": self.stop_timeout_s,
        }

    @classmethod
    def from_spec(cls, name: str, spec: Mapping[str, Any]) -> ComponentRequest:
        body = dict(spec)
        body["name"] = name
        # The record's replica count is the truth (it may be 0 after a scale-in);
        # the stored spec's copy is not a request to validate.
        body.pop("replicas", None)
        return parse_component(body)


_COMPONENT_KEYS = {
    "name", "claim", "replicas", "scope", "share_with", "shadow_of", "command",
    "shell", "env", "cwd", "restart", "stop_timeout_s", "lease",
}


def parse_component(body: Any) -> ComponentRequest:
    data = _object(body, "body", _COMPONENT_KEYS)
    if "name" not in data:
        raise RequestError("name: required")
    name = check_name(data["name"])
    claim = _claim(data.get("claim"))
    share_with = _optional_name(data, "share_with")
    shadow_of = _optional_name(data, "shadow_of")
    if share_with and shadow_of:
        raise RequestError("share_with: cannot be combined with shadow_of")
    if claim is not None and (share_with or shadow_of):
        which = "share_with" if share_with else "shadow_of"
        raise RequestError(f"claim: not allowed with {which}: the groups come from {data[which]!r}")
    if name in (share_with, shadow_of):
        raise RequestError("share_with: a component cannot share with itself")
    scope = data.get("scope", "per-replica")
    if scope not in SCOPES:
        raise RequestError(f"scope: must be one of {', '.join(SCOPES)}, got {scope!r}")
    command = _command(data.get("command"))
    shell = _bool(data, "shell", False)
    if shell and (command is None or len(command) != 1):
        raise RequestError("shell: needs a command of exactly one string (the shell line)")
    return ComponentRequest(
        name=name,
        claim=claim,
        replicas=_int(data, "replicas", 1, 1, MAX_REPLICAS),
        scope=scope,
        share_with=share_with,
        shadow_of=shadow_of,
        command=command,
        shell=shell,
        env=_env(data.get("env")),
        cwd=_optional_str(data, "cwd"),
        restart=_restart(data.get("restart")),
        stop_timeout_s=_number(data, "stop_timeout_s", 10.0, 0.0, 3600.0),
        lease=_bool(data, "lease", False),
    )


@dataclass(frozen=True)
class ReservationRequest:
    name: str
    claim: Claim
    replicas: int = 1
    scope: str = "per-replica"
    ttl_s: float = 600.0


def parse_reservation(body: Any) -> ReservationRequest:
    data = _object(body, "body", {"name", "claim", "replicas", "scope", "ttl_s"})
    if "name" not in data:
        raise RequestError("name: required")
    claim = _claim(data.get("claim"))
    if claim is None:
        raise RequestError("claim: required")
    scope = data.get("scope", "per-replica")
    if scope not in SCOPES:
        raise RequestError(f"scope: must be one of {', '.join(SCOPES)}, got {scope!r}")
    return ReservationRequest(
        name=check_name(data["name"]),
        claim=claim,
        replicas=_int(data, "replicas", 1, 1, MAX_REPLICAS),
        scope=scope,
        ttl_s=_number(data, "ttl_s", 600.0, 1.0, 30 * 24 * 3600.0),
    )


def parse_scale(body: Any) -> int:
    data = _object(body, "body", {"replicas"})
    if "replicas" not in data:
        raise RequestError("replicas: required")
    return _int(data, "replicas", 1, 0, MAX_REPLICAS)


def parse_restart(body: Any) -> int | None:
    """The replica to restart, or None for all of them."""
    data = _object(body, "body", {"replica"})
    if data.get("replica") is None:
        return None
    return _int(data, "replica", 0, 0, MAX_REPLICAS - 1)


def parse_group(body: Any) -> Claim:
    data = _object(body, "body", {"claim"})
    claim = _claim(data.get("claim"))
    if claim is None:
        raise RequestError("claim: required")
    return claim


def _object(value: Any, path: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"{path}: expected a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        where = unknown[0] if path == "body" else f"{path}.{unknown[0]}"
        raise RequestError(f"{where}: unknown field (known: {', '.join(sorted(allowed))})")
    return value


def _claim(value: Any) -> Claim | None:
    if value is None:
        return None
    try:
        return Claim.from_dict(value)
    except ClaimError as exc:
        raise RequestError(str(exc)) from None


def _optional_name(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else check_name(value, key)


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise RequestError(f"{key}: expected a non-empty string")
    return value


def _bool(data: dict[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{key}: expected true or false")
    return value


def _int(data: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key}: expected an integer")
    if not lo <= value <= hi:
        raise RequestError(f"{key}: must be between {lo} and {hi}, got {value}")
    return value


def _number(data: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{key}: expected a number")
    if not lo <= value <= hi:
        raise RequestError(f"{key}: must be between {lo:g} and {hi:g}, got {value}")
    return float(value)


def _command(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise RequestError("command: expected a non-empty list of strings (argv)")
    for i, arg in enumerate(value):
        if not isinstance(arg, str) or "\0" in arg:
            raise RequestError(f"command[{i}]: expected a string without NUL bytes")
    if not value[0]:
        raise RequestError("command[0]: the program may not be empty")
    return tuple(value)


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("env: expected an object of strings")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise RequestError(f"env.{key[:40]}: not a valid variable name")
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise RequestError(f"env.{key}: CG_* and CUDA_* are set by cgd from the compute group")
        if not isinstance(val, str) or "\0" in val:
            raise RequestError(f"env.{key}: expected a string without NUL bytes")
        out[key] = val
    return out


def _restart(value: Any) -> RestartSpec:
    if value is None:
        return RestartSpec()
    data = _object(value, "restart", {"max_retries", "backoff_s"})
    return RestartSpec(
        max_retries=_int(data, "max_retries", 5, 0, 1000),
        backoff_s=_number(data, "backoff_s", 1.0, 0.0, 3600.0),
    )
