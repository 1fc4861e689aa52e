"""Allocate flags to request bodies, without a daemon."""

from __future__ import annotations

import os
import re
from typing import Any

import click
import pytest

from computegroups.cli.options import (
    AffinityType,
    DurationType,
    EnvType,
    GpuIdsType,
    SizeType,
    build_claim,
    build_component,
    build_reservation,
    worker_env,
)


def _opts(**given: Any) -> dict[str, Any]:
    base: dict[str, Any] = {k: None for k in (
        "gpus", "memory", "compute", "mig", "strategy", "colocate", "exclusive", "distinct", "pool",
        "gpu_ids", "priority", "allow_busy", "scope", "share_with", "shadow_of", "cwd")}
    base.update(affinity=(), anti_affinity=(), env=(), replicas=1)
    base.update(given)
    return base


@pytest.mark.parametrize("text, mib", [("20GiB", 20480), ("512MiB", 512), ("20G", 20480), ("1.5g", 1536)])
def test_sizes(text: str, mib: int) -> None:
    assert SizeType().convert(text, None, None) == mib


@pytest.mark.parametrize("text", ["20Q", "-1G", "", "0"])
def test_bad_sizes_are_usage_errors(text: str) -> None:
    with pytest.raises(click.BadParameter):
        SizeType().convert(text, None, None)


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2d", 172800)])
def test_durations(text: str, seconds: float) -> None:
    assert DurationType().convert(text, None, None) == seconds


@pytest.mark.parametrize("text", ["ten minutes", "10x", "0s", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(click.BadParameter):
        DurationType().convert(text, None, None)


def test_gpu_ids_affinity_and_env_types() -> None:
    assert GpuIdsType().convert("0, 3", None, None) == [0, 3]
    assert AffinityType().convert("web", None, None) == {"component": "web", "level": "device"}
    assert AffinityType().convert("web:nvlink", None, None) == {"component": "web", "level": "nvlink"}
    assert EnvType().convert("A=b=c", None, None) == ("A", "b=c")
    for bad, kind in (("0,x", GpuIdsType), ("web:rack", AffinityType), ("NOEQUALS", EnvType)):
        with pytest.raises(click.BadParameter):
            kind().convert(bad, None, None)


def test_whole_gpus_with_placement() -> None:
    claim = build_claim(_opts(gpus=2, colocate="nvlink", distinct=True, gpu_ids=[0, 1, 2],
                              affinity=({"component": "db", "level": "numa"},), priority=5))
    assert claim == {"gpus": 2, "colocate": "nvlink", "distinct": True, "gpu_ids": [0, 1, 2],
                     "affinity": [{"component": "db", "level": "numa"}], "priority": 5}


def test_share_and_mig() -> None:
    assert build_claim(_opts(memory=20480, compute=30)) == {"memory_mib": 20480, "compute_pct": 30}
    assert build_claim(_opts(mig="1g.10gb")) == {"mig": "1g.10gb"}


@pytest.mark.parametrize("given, words", [
    ({"gpus": 1, "memory": 100}, "--gpus asks for whole devices"),
    ({"mig": "1g.10gb", "compute": 10}, "--mig asks for a MIG instance"),
    ({"strategy": "spread"}, "--strategy places a claim"),
])
def test_claims_that_do_not_combine(given: dict[str, Any], words: str) -> None:
    with pytest.raises(click.UsageError, match=words):
        build_claim(_opts(**given))


def test_no_size_means_no_claim() -> None:
    assert build_claim(_opts()) is None


def test_component_with_command_runs_here_by_default() -> None:
    body = build_component("web", _opts(gpus=1, replicas=2, env=(("A", "1"),)), ("python", "serve.py"))
    assert body == {"name": "web", "claim": {"gpus": 1}, "replicas": 2, "command": ["python", "serve.py"],
                    "env": {"PATH": os.environ["PATH"], "A": "1"}, "cwd": os.getcwd()}


def test_workers_get_the_callers_path_and_with_export_everything_but_what_cgd_sets() -> None:
    shell = {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/ada", "CUDA_HOME": "/usr/local/cuda",
             "CUDA_VISIBLE_DEVICES": "3", "CG_GROUP": "old", "LD_PRELOAD": "/x.so", "BASH_FUNC_f%%": "() {}"}
    assert worker_env(shell, export=False, root=False) == {"PATH": "/venv/bin:/usr/bin"}
    assert worker_env(shell, export=True, root=False) == {
        "PATH": "/venv/bin:/usr/bin", "HOME": "/home/ada", "CUDA_HOME": "/usr/local/cuda", "LD_PRELOAD": "/x.so"}
    assert "LD_PRELOAD" not in worker_env(shell, export=True, root=True)


def test_job_flags_reach_the_request() -> None:
    body = build_component("job", _opts(gpus=1, restart_policy="never", max_retries=2, time_limit=90.0),
                           ("python", "train.py"))
    assert body["restart"] == {"policy": "never", "max_retries": 2} and body["time_limit_s"] == 90.0


def test_allocation_only_has_no_cwd_and_a_lease_when_asked() -> None:
    assert build_component("web", _opts(gpus=1)) == {"name": "web", "claim": {"gpus": 1}}
    assert build_component("web", _opts(gpus=1), lease=True)["lease"] is True


def test_sharing_takes_no_claim() -> None:
    body = build_component("side", _opts(share_with="web", scope="all-replicas"))
    assert body == {"name": "side", "share_with": "web", "scope": "all-replicas"}
    with pytest.raises(click.UsageError, match="--share-with uses existing groups"):
        build_component("side", _opts(share_with="web", gpus=1))
    with pytest.raises(click.UsageError, match="exclude each other"):
        build_component("side", _opts(share_with="web", shadow_of="web"))
    assert build_component("side", _opts(group="group.1")) == {"name": "side", "group": "group.1"}
    with pytest.raises(click.UsageError, match="exclude each other"):
        build_component("side", _opts(share_with="web", group="group.1"))


def test_reservation_body() -> None:
    body = build_reservation("train", _opts(gpus=4, replicas=2, scope="all-replicas"), 600.0)
    assert body == {"name": "train", "claim": {"gpus": 4}, "replicas": 2, "ttl_s": 600.0, "scope": "all-replicas"}
    with pytest.raises(click.UsageError, match="holds capacity"):
        build_reservation("train", _opts(), 600.0)


@pytest.mark.parametrize(("given", "message"), [
    ({"gpus": 1, "compute_capability": "9"}, "--compute-capability: expected a compute capability such as '8.0'"),
    ({"gpus": 1, "priority": 5000}, "--priority: must be between -1000 and 1000, got 5000"),
    ({"gpus": 2, "gpu_ids": [3]}, "--gpu-ids: pins 1 GPU"),
    ({"gpus": 1, "share": "whole"}, "--share: only for a memory/compute claim"),
    ({"cpus": 2, "priority": -2000}, "--priority: must be between -1000 and 1000"),
])
def test_the_models_rules_refuse_a_claim_as_a_usage_error_naming_the_flag(given: dict[str, Any],
                                                                         message: str) -> None:
    with pytest.raises(click.UsageError, match="^" + re.escape(message)):
        build_claim(_opts(**given))
