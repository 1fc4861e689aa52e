"""The allocate options shared by `allocate`, `run` and `reserve`, and the
pure functions that turn them into request bodies of docs/api.md.

Keeping parsing apart from sending lets the tests check every flag's body
without a daemon, and keeps the three commands from drifting apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from computegroups.daemon.model.sizes import parse_size

F = TypeVar("F", bound=Callable[..., Any])
Json = Any

DOMAINS = ("nvlink", "pcie", "numa")
LEVELS = ("device", "nvlink", "pcie", "numa", "machine")
SIZE_KEYS = ("gpus", "memory", "compute", "mig")
PLACEMENT_KEYS = ("strategy", "colocate", "exclusive", "distinct", "pool", "gpu_ids",
                  "priority", "allow_busy", "affinity", "anti_affinity", "share", "model", "min_memory_mib",
                  "compute_capability", "same")
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER = r"\d+(?:\.\d+)?"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class NameType(click.ParamType):
    """A component name, checked by the model's own rule: a mistyped name is a usage error (exit 2)."""

    name = "NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from computegroups.daemon.model.names import name_problem

        problem = name_problem(value)
        if problem is not None:
            self.fail(problem, param, ctx)
        return str(value)


NAME = NameType()


class SizeType(click.ParamType):
    """A memory size: `20GiB`, `512MiB`, `20G`. cgd counts MiB."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class DurationType(click.ParamType):
    """A time to live: `90s`, `10m`, `1h30m`, `2d`, or plain seconds."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower().replace(" ", "")
        if re.fullmatch(_NUMBER, text):
            seconds = float(text)
        elif re.fullmatch(f"(?:{_NUMBER}[smhd])+", text):
            seconds = sum(float(n) * _TTL_UNITS[u] for n, u in re.findall(f"({_NUMBER})([smhd])", text))
        else:
            self.fail(f"{value!r} is not a duration: write it like 90s, 10m, 1h30m or 2d", param, ctx)
        if seconds <= 0:
            self.fail(f"{value!r}: a duration must be positive", param, ctx)
        return seconds


class GpuIdsType(click.ParamType):
    name = "IDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, list):
            return value
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            self.fail(f"{value!r} is not a list of GPU indices: write it like 0,1", param, ctx)
        return [int(p) for p in parts]


class AffinityType(click.ParamType):
    """`COMPONENT` or `COMPONENT:LEVEL`; the level defaults to `device`."""

    name = "COMPONENT[:LEVEL]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, str]:
        if isinstance(value, dict):
            return value
        component, _, level = str(value).partition(":")
        level = level or "device"
        if not component or level not in LEVELS:
            self.fail(f"{value!r}: write COMPONENT or COMPONENT:LEVEL, LEVEL one of {', '.join(LEVELS)}",
                      param, ctx)
        return {"component": component, "level": level}


class EnvType(click.ParamType):
    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, val = str(value).partition("=")
        if not sep or not key:
            self.fail(f"{value!r} is not KEY=VALUE", param, ctx)
        return key, val


def _stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f
    return apply


def _claim_options(whole: str, holder: str) -> Callable[[F], F]:
    """The claim's flags; `whole` says what `--gpus` counts and `holder` whose devices a claim
    keeps together (a group has no replicas)."""
    return _stack(
        click.option("--gpus", type=click.IntRange(min=1), help=whole),
        click.option("--memory", type=SizeType(), help="A share of one device: memory (20GiB, 512MiB, 20G)."),
        click.option("--compute", type=click.IntRange(1, 100), metavar="PCT",
                     help="A share of one device: percent of its SMs."),
        click.option("--mig", metavar="PROFILE", help="A MIG instance of this profile (e.g. 1g.10gb)."),
        click.option("--cpus", type=click.IntRange(min=0), metavar="N",
                     help="CPUs counted against the machine's; alone, a CPU-only claim (no GPU)."),
        click.option("--strategy", type=click.Choice(["binpack", "spread"]),
                     help="binpack fills used GPUs first; spread takes the emptiest."),
        click.option("--colocate", type=click.Choice([*DOMAINS, "machine", "none"]),
                     help=f"Keep {holder} devices inside one domain."),
        click.option("--exclusive", type=click.Choice(DOMAINS), help="Take a domain nobody else uses."),
        click.option("--distinct", is_flag=True, default=None,
                     help="Each replica's group on its own physical GPU (DRA distinctAttribute)."),
        click.option("--pool", help="Only GPUs of this pool (cgd's config)."),
        click.option("--gpu-ids", type=GpuIdsType(), help="Only these GPUs, e.g. 0,1."),
        click.option("--priority", type=int, help="Higher priority takes over lower reservations."),
        click.option("--allow-busy", is_flag=True, default=None,
                     help="Accept GPUs with processes cgd does not manage."),
        click.option("--affinity", type=AffinityType(), multiple=True,
                     help="Place near COMPONENT (level device by default). Repeatable."),
        click.option("--anti-affinity", type=AffinityType(), multiple=True,
                     help="Place away from COMPONENT (level device by default). Repeatable."),
        click.option("--share", type=click.Choice(["whole", "share", "any"]),
                     help="For --memory/--compute: a whole GPU only, a share only, or either."),
        click.option("--model", metavar="GLOB", help="Only GPUs whose model matches (e.g. '*H100*')."),
        click.option("--min-memory", "min_memory_mib", type=SizeType(),
                     help="Only GPUs with at least this much memory in all."),
        click.option("--compute-capability", metavar="X.Y", help="Only GPUs of at least this compute capability."),
        click.option("--same", type=click.Choice(["model"]),
                     help="Every device of the request of one model (DRA matchAttribute)."),
    )


claim_options = _claim_options("Whole devices per replica.", "one replica's")
group_claim_options = _claim_options("Whole devices the group holds.", "the group's")

shape_options = _stack(
    click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
                 help="How many replicas."),
    click.option("--scope", type=click.Choice(["per-replica", "all-replicas"]),
                 help="A group per replica (default), or one group every replica shares."),
)

attach_options = _stack(
    click.option("--share-with", metavar="COMPONENT", help="Use that component's groups instead of a claim."),
    click.option("--shadow-of", metavar="COMPONENT", help="A warm standby on that component's groups."),
    click.option("--group", "group", metavar="ID",
                 help="Use this group (made by `cgctl group create`) instead of a claim."),
)

process_options = _stack(
    click.option("--env", "env", type=EnvType(), multiple=True,
                 help="Set a variable for the command (besides your PATH). Repeatable."),
    click.option("--cwd", type=click.Path(exists=True, file_okay=False, resolve_path=True),
                 help="Working directory (default: the current one when a command is given)."),
    click.option("--explain", is_flag=True, help="Say why these devices were chosen."),
    click.option("--cpu-bind", type=click.Choice(["numa", "none"]),
                 help="numa: run on the CPUs local to the GPUs; none: on any (default: cgd's)."),
)

job_options = _stack(
    click.option("--export-env", is_flag=True,
                 help="Pass your whole environment to the workers (Slurm's --export=ALL), "
                      "but what selects devices (CG_*, CUDA_VISIBLE_DEVICES...)."),
    click.option("--restart", "restart_policy", type=click.Choice(["always", "on-failure", "never"]),
                 help="When a worker that ended runs again [default: on-failure, unless it exited 0]."),
    click.option("--max-retries", type=click.IntRange(0, 1000),
                 help="Quick failures in a row before giving up [default: 5]."),
    click.option("--time-limit", type=DurationType(), metavar="DURATION",
                 help="Stop it this long after it starts and mark it timeout (90s, 10m, 2h)."),
)

FOREVER = "forever"

wait_options = _stack(
    click.option("--wait", "wait", is_flag=False, flag_value=FOREVER, default=None, metavar="[TIMEOUT]",
                 help="If it does not fit now, queue it and wait for its turn (like salloc); "
                      "a TIMEOUT (10m, 2h) gives up after that."),
    click.option("--detach", is_flag=True,
                 help="If it does not fit now, queue it and return at once (like sbatch)."),
)


def build_claim(opts: Mapping[str, Any]) -> dict[str, Json] | None:
    """The Claim for the given flags; None when no size flag was given (the
    groups then come from a reservation, `--share-with` or `--shadow-of`)."""
    given = [k for k in SIZE_KEYS if opts.get(k) is not None]
    if opts.get("gpus") is not None and len(given) > 1:
        raise click.UsageError("--gpus asks for whole devices: leave out --memory, --compute and --mig")
    if opts.get("mig") is not None and len(given) > 1:
        raise click.UsageError("--mig asks for a MIG instance: leave out --memory and --compute")
    placement = {k: opts[k] for k in PLACEMENT_KEYS if opts.get(k) not in (None, ())}
    if not given and opts.get("cpus") is not None:
        claim_cpu: dict[str, Json] = {"cpus": opts["cpus"]}
        if "priority" in placement:
            claim_cpu["priority"] = placement.pop("priority")
        if placement:
            flag = "--" + next(iter(placement)).replace("_", "-")
            raise click.UsageError(f"{flag} chooses among GPUs: a --cpus claim alone has none")
        return checked(claim_cpu)
    if not given:
        if placement:
            flag = "--" + next(iter(placement)).replace("_", "-")
            raise click.UsageError(f"{flag} places a claim: say what it needs with --gpus, --memory or --mig")
        return None
    claim: dict[str, Json] = {}
    if opts.get("gpus") is not None:
        claim["gpus"] = opts["gpus"]
    if opts.get("memory") is not None:
        claim["memory_mib"] = opts["memory"]
    if opts.get("compute") is not None:
        claim["compute_pct"] = opts["compute"]
    if opts.get("mig") is not None:
        claim["mig"] = opts["mig"]
    if opts.get("cpus") is not None:
        claim["cpus"] = opts["cpus"]
    for key, value in placement.items():
        claim[key] = list(value) if isinstance(value, tuple) else value
    return checked(claim)


FLAGS = {"memory_mib": "--memory", "compute_pct": "--compute", "min_memory_mib": "--min-memory"}
"""The claim's keys whose flag is not the key with dashes."""


def checked(claim: dict[str, Json]) -> dict[str, Json]:
    """`claim` as the model takes it, or a usage error (exit 2) naming the flag: a value out of the
    model's bounds (`--priority 5000`) or flags that do not combine are the typist's, not cgd's."""
    # Imported here, as the one copy of the rules cgd applies: the model costs start-up time
    # that only the commands that send a claim need.
    from computegroups.daemon.model.claims import Claim

    try:
        Claim.from_dict(claim)
    except ValueError as exc:
        key, _, problem = str(exc).removeprefix("claim.").partition(": ")
        flag = FLAGS.get(key, "--" + key.replace("_", "-"))
        raise click.UsageError(f"{flag}: {problem}" if problem else str(exc)) from None
    return claim


def build_component(name: str, opts: Mapping[str, Any], command: tuple[str, ...] = (),
                    lease: bool = False) -> dict[str, Json]:
    """A ComponentRequest body. A command runs in the current directory
    unless `--cwd` says otherwise: cgd's own directory means nothing to the
    user who typed a relative path."""
    claim = build_claim(opts)
    attach = [f for f in ("share_with", "shadow_of", "group") if opts.get(f)]
    if len(attach) > 1:
        raise click.UsageError("--share-with, --shadow-of and --group exclude each other")
    if attach and claim is not None:
        flag = "--" + attach[0].replace("_", "-")
        raise click.UsageError(f"{flag} uses existing groups: leave out the size and placement flags")
    body: dict[str, Json] = {"name": name}
    if claim is not None:
        body["claim"] = claim
    if opts.get("replicas", 1) != 1:
        body["replicas"] = opts["replicas"]
    for key in ("scope", *attach):
        if opts.get(key):
            body[key] = opts[key]
    if command:
        body["command"] = list(command)
    env = worker_env(os.environ, export=bool(opts.get("export_env")), root=os.geteuid() == 0) if command else {}
    env.update(dict(opts.get("env") or ()))
    if env:
        body["env"] = env
    cwd = opts.get("cwd") or (os.getcwd() if command else None)
    if cwd:
        body["cwd"] = cwd
    restart = {k: v for k, v in (("policy", opts.get("restart_policy")), ("max_retries", opts.get("max_retries")))
               if v is not None}
    if restart:
        body["restart"] = restart
    if opts.get("time_limit") is not None:
        body["time_limit_s"] = opts["time_limit"]
    if opts.get("cpu_bind"):
        body["cpu_bind"] = opts["cpu_bind"]
    if lease:
        body["lease"] = True
    return body


def worker_env(current: Mapping[str, str], *, export: bool, root: bool) -> dict[str, str]:
    """What of the caller's environment reaches the workers: their PATH always (so a venv's python
    is the one found), everything with `--export-env`, except what cgd sets from the group and,
    for a worker that runs as root, the dynamic loader's variables."""
    if not export:
        return {"PATH": current["PATH"]} if "PATH" in current else {}
    # Imported here, as the one copy of the rules cgd applies: the model costs start-up time
    # that only this option needs.
    from computegroups.daemon.model.requests import env_problem

    return {k: v for k, v in current.items()
            if _ENV_NAME.fullmatch(k) and env_problem(k, as_root=root) is None}


def build_reservation(name: str, opts: Mapping[str, Any], ttl_s: float) -> dict[str, Json]:
    claim = build_claim(opts)
    if claim is None:
        raise click.UsageError("a reservation holds capacity: say how much with --gpus, --memory or --mig")
    body: dict[str, Json] = {"name": name, "claim": claim, "replicas": opts.get("replicas", 1), "ttl_s": ttl_s}
    if opts.get("scope"):
        body["scope"] = opts["scope"]
    return body
