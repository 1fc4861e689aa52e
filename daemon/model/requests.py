"""The bodies callers send, as the model decodes them.

Each request type states its own rules: types, ranges and names in the
annotations, unknown fields refused, the combinations in `__post_init__`.
The API decodes a body straight into one of these (`decoding.decode_json`),
so the manager only ever sees well-formed requests and a refused request
cannot have changed anything.

`ComponentSpec` is the form of a component kept in the state file (the
lease and the name live on the record); `ComponentRequest.spec` and
`from_spec` are its two directions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from computegroups.daemon.model.claims import Claim, Name
from computegroups.daemon.model.decoding import (
    PATTERN_PROBLEMS,
    ModelError,
    convert,
)
from computegroups.daemon.model.enums import CpuBind, RestartMode, Scope
from computegroups.daemon.model.names import NAME_PATTERN, NAME_RE

__all__ = [
    "LOADER_ENV",
    "MAX_REPLICAS",
    "NAME_RE",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "SCOPES",
    "ComponentRequest",
    "ComponentSpec",
    "GroupRequest",
    "RequestError",
    "ReservationRequest",
    "ReservationSpec",
    "RestartRequest",
    "RestartSpec",
    "ScaleRequest",
    "Scope",
    "check_env",
    "check_name",
    "env_problem",
    "parse_component",
    "parse_group",
    "parse_reservation",
    "parse_restart",
    "parse_scale",
    "reserved_env",
]

RESERVED_ENV_PREFIXES = ("CG_", "CUDA_MPS_")
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"})
"""Set by cgd from the compute group: a worker that set them could lie about its GPUs. Other CUDA_*
variables (CUDA_HOME, CUDA_CACHE_PATH) are the user's."""
LOADER_ENV = frozenset({
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT", "LD_PROFILE",
    "LD_PROFILE_OUTPUT", "LD_ORIGIN_PATH", "LD_DYNAMIC_WEAK", "LD_SHOW_AUXV", "LD_USE_LOAD_BIAS",
    "LD_HWCAP_MASK", "LD_BIND_NOT", "GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN",
    "LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR",
    "TZDIR",
})
"""What the dynamic loader reads to run other code (glibc's list of variables it ignores for setuid
programs): never set for a worker that runs as root."""


def reserved_env(key: str) -> bool:
    """Whether cgd sets `key` itself from the compute group (never the caller's to pass)."""
    return key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES)


def env_problem(key: str, *, as_root: bool) -> str | None:
    """Why `key` may not reach a worker (one that runs as root when `as_root`); None when it may.

    The one rule for a worker's environment: the model refuses the reserved
    names in every request, the core refuses the loader's variables for a
    root worker before anything is allocated, the worker's environment is
    built only from what passes, and cgctl drops from `--export-env` what
    would be refused.
    """
    if reserved_env(key):
        return (f"{key}: CG_*, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and CUDA_MPS_* are set by cgd "
                "from the compute group")
    if as_root and key in LOADER_ENV:
        return (f"{key}: not passed to a worker that runs as root: it changes what code runs there "
                "(set it in the command itself if you mean it)")
    return None


def check_env(env: Iterable[str], *, as_root: bool) -> None:
    """Raise ValueError (`env.KEY: why`) for the first variable `env_problem` refuses."""
    for key in sorted(env):
        problem = env_problem(key, as_root=as_root)
        if problem is not None:
            raise ValueError(f"env.{problem}")


MAX_REPLICAS = 1024

RequestError = ModelError
"""A malformed request; the message names the field."""

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
PATTERN_PROBLEMS[_ENV_NAME] = "not a valid variable name"
_NO_NUL = r"^[^\x00]*$"
PATTERN_PROBLEMS[_NO_NUL] = "expected a string without NUL bytes"
Text = Annotated[str, Meta(pattern=_NO_NUL)]
_GROUP_ID = r"^[a-z0-9][a-z0-9.-]{0,199}$"
PATTERN_PROBLEMS[_GROUP_ID] = "not a group id (`cgctl group list` lists them)"
GroupId = Annotated[str, Meta(pattern=_GROUP_ID)]
EnvName = Annotated[str, Meta(pattern=_ENV_NAME)]
Replicas = Annotated[int, Meta(ge=1, le=MAX_REPLICAS)]
Seconds = Annotated[float, Meta(ge=0, le=3600)]
TimeLimit = Annotated[float, Meta(gt=0, le=366 * 24 * 3600)]


SCOPES = tuple(s.value for s in Scope)


def check_name(value: Any, path: str = "name") -> str:
    """A name that arrives outside a body (a URL segment): the same rule as `Name`."""
    if not isinstance(value, str):
        raise RequestError(path, "expected a string")
    if not NAME_RE.fullmatch(value):
        raise RequestError(path, PATTERN_PROBLEMS[NAME_PATTERN].format(value=repr(value[:80])))
    return value


class RestartSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    policy: RestartMode | None = None
    """None until the component is made: then `on-failure` for one allocated with a command (a job),
    `always` for a deployment's (a service). A record written before policies existed has None: `always`."""
    max_retries: Annotated[int, Meta(ge=0, le=1000)] = 5
    backoff_s: Seconds = 1.0

    @property
    def mode(self) -> RestartMode:
        return self.policy or RestartMode.ALWAYS


class _Process(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a component runs and how it attaches to groups: shared by the request and the stored spec."""

    claim: Claim | None = None
    scope: Scope = Scope.PER_REPLICA
    share_with: Name | None = None
    shadow_of: Name | None = None
    group: GroupId | None = None
    """A group made on its own (`POST /v1/groups`) that every replica attaches to, instead of a claim."""
    command: Annotated[tuple[Text, ...], Meta(min_length=1)] | None = None
    shell: bool = False
    env: dict[EnvName, Text] = {}
    cwd: Annotated[str, Meta(min_length=1, pattern=_NO_NUL)] | None = None
    restart: RestartSpec = RestartSpec()
    stop_timeout_s: Seconds = 10.0
    time_limit_s: TimeLimit | None = None
    """A replica still running this long after it started is stopped and marked `timeout` (Slurm's --time)."""
    cpu_bind: CpuBind | None = None
    """`numa`: the worker runs on the CPUs local to its GPUs; `none`: on any; None: cgd's default."""

    def __post_init__(self) -> None:
        attach = [k for k in ("share_with", "shadow_of", "group") if getattr(self, k)]
        if len(attach) > 1:
            raise ValueError(f"{attach[0]}: cannot be combined with {attach[1]}")
        if self.claim is not None and attach:
            which = attach[0]
            raise ValueError(f"claim: not allowed with {which}: the groups come from {getattr(self, which)!r}")
        if self.command is not None and not self.command[0]:
            raise ValueError("command[0]: the program may not be empty")
        if self.shell and (self.command is None or len(self.command) != 1):
            raise ValueError("shell: needs a command of exactly one string (the shell line)")
        check_env(self.env, as_root=False)  # the root rule needs the worker's user: see env_problem


class ComponentSpec(_Process, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A component as the state file keeps it (`ComponentRecord.spec`).

    The replica count is not part of it: the record's own count is the one
    truth (it changes with every scale).
    """


class ComponentRequest(_Process, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/components`."""

    name: Name
    replicas: Replicas = 1
    lease: bool = False
    wait: bool = False
    """A claim that does not fit now is queued (`pending`) instead of refused."""
    detach: bool = False
    """With `wait`: the queued component stays queued when the asking client goes (sbatch), instead of being dropped."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.name in (self.share_with, self.shadow_of):
            raise ValueError("share_with: a component cannot share with itself")
        if self.detach and not self.wait:
            raise ValueError("detach: only with wait (a claim that is not queued has nothing to detach from)")
        if self.detach and self.lease:
            raise ValueError("detach: not with lease (a detached component outlives its client)")

    def spec(self) -> ComponentSpec:
        """The form kept in the state file (the lease lives on the record)."""
        return ComponentSpec(
            claim=self.claim, scope=self.scope, share_with=self.share_with,
            shadow_of=self.shadow_of, group=self.group, command=self.command, shell=self.shell,
            env=dict(self.env), cwd=self.cwd,
            restart=self.restart, stop_timeout_s=float(self.stop_timeout_s), time_limit_s=self.time_limit_s,
            cpu_bind=self.cpu_bind,
        )

    @classmethod
    def from_spec(cls, name: str, s: ComponentSpec) -> ComponentRequest:
        """The request a stored component was made from (its replica count left to the record)."""
        return cls(
            name=name, claim=s.claim, scope=s.scope, share_with=s.share_with, shadow_of=s.shadow_of,
            group=s.group, command=s.command, shell=s.shell, env=dict(s.env), cwd=s.cwd, restart=s.restart,
            stop_timeout_s=s.stop_timeout_s, time_limit_s=s.time_limit_s, cpu_bind=s.cpu_bind,
        )


class ReservationSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A reservation as the state file keeps it (`ReservationRecord.spec`; the name is the record's)."""

    claim: Claim
    replicas: Replicas = 1
    scope: Scope = Scope.PER_REPLICA
    ttl_s: Annotated[float, Meta(ge=1, le=30 * 24 * 3600)] = 600.0


class ReservationRequest(ReservationSpec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/reservations`."""

    name: Name

    def spec(self) -> ReservationSpec:
        """The form kept in the state file (the name lives on the record)."""
        return ReservationSpec(claim=self.claim, replicas=self.replicas, scope=self.scope, ttl_s=float(self.ttl_s))


class ScaleRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/components/<name>/scale`."""

    replicas: Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]


class RestartRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/components/<name>/restart`: one replica, or (None) all of them."""

    replica: Annotated[int, Meta(ge=0, le=MAX_REPLICAS - 1)] | None = None


class GroupRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /v1/groups`."""

    claim: Claim


def parse_component(body: Any) -> ComponentRequest:
    return convert(body, ComponentRequest)


def parse_reservation(body: Any) -> ReservationRequest:
    return convert(body, ReservationRequest)


def parse_scale(body: Any) -> int:
    return convert(body, ScaleRequest).replicas


def parse_restart(body: Any) -> int | None:
    """The replica to restart, or None for all of them."""
    return convert(body, RestartRequest).replica


def parse_group(body: Any) -> Claim:
    return convert(body, GroupRequest).claim
