"""`cgctl --kubernetes apply / get / delete / list`, run as users run it, against the emulated cluster."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider
from tests.daemon_fixture import _executable
from tests.kubernetes.emulator import HOLD_REASON, PCS, EmulatedCluster, write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
SHARING = ROOT / "docs" / "examples" / "grove-sharing.toml"


def cgctl(kubeconfig: Path | str, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "CG_SOCKET": "/nonexistent/cgd.sock"}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([_executable("cgctl"), *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def narrow(text: str) -> bool:
    return all(len(line) <= 80 for line in text.splitlines())


def test_apply_get_and_delete_a_deployment_as_a_podcliqueset(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    applied = cgctl(kubeconfig, "--kubernetes", "apply", "-f", str(SHARING), "--image", "example/worker:1")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == "deployment rs created in namespace cg-test: PodCliqueSet/rs\n"
    assert "cgctl: warning: components[" in applied.stderr and narrow(applied.stderr)  # the shadow
    (pcs,) = cluster.objects(PCS)
    assert pcs["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "computegroups",
                                         "computegroups.io/deployment": "rs"}
    assert pcs["metadata"]["namespace"] == "cg-test"
    assert {t["name"] for t in pcs["spec"]["template"]["resourceClaimTemplates"]} >= {"set-pool", "kv"}

    again = cgctl(kubeconfig, "--kubernetes", "apply", "-f", str(SHARING), "--image", "example/worker:2")
    assert again.stdout.startswith("deployment rs configured"), again.stderr
    (pcs,) = cluster.objects(PCS)
    images = {c["spec"]["podSpec"]["containers"][0]["image"] for c in pcs["spec"]["template"]["cliques"]}
    assert images == {"example/worker:2"}

    shown = cgctl(kubeconfig, "--kubernetes", "get", "rs")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("deployment rs  1 replica  namespace cg-test\n") and narrow(shown.stdout)
    assert "  clique worker-a  replicas 1\n" in shown.stdout and "  scaling group sga  replicas 2" in shown.stdout
    as_json = json.loads(cgctl(kubeconfig, "--kubernetes", "get", "rs", "--json").stdout)
    assert as_json["name"] == "rs" and "set-pool" in as_json["claims"]
    listed = cgctl(kubeconfig, "--kubernetes", "get")
    assert listed.stdout.splitlines()[0].split() == ["NAME", "NAMESPACE", "REPLICAS", "CLIQUES", "CLAIMS"]
    assert listed.stdout.splitlines()[1].split()[:2] == ["rs", "cg-test"]

    deleted = cgctl(kubeconfig, "--kubernetes", "delete", "-f", str(SHARING))
    assert deleted.stdout == "deleted rs (PodCliqueSet in namespace cg-test)\n", deleted.stderr
    assert cluster.objects(PCS) == []
    gone = cgctl(kubeconfig, "--kubernetes", "get", "rs")
    assert (gone.returncode, gone.stderr) == (1, "cgctl: error: no deployment rs in namespace cg-test\n")


def test_apply_reads_the_files_include_names_and_each_components_own_image(
        cluster: EmulatedCluster, kubeconfig: Path, tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "gpu.toml").write_text('[[claims]]\nname = "gpu"\ngpus = 1\n')
    path = tmp_path / "d.toml"
    path.write_text('name = "inc"\ninclude = ["claims/gpu.toml"]\n'
                    '[[components]]\nname = "a"\ncommand = ["x"]\nimage = "example/a:1"\ntime_limit_s = 60\n'
                    'sharing = [{claim = "gpu", scope = "per-replica"}]\n'
                    '[[components]]\nname = "b"\ncommand = ["x"]\n')
    refused = cgctl(kubeconfig, "--kubernetes", "apply", "-f", str(path))
    assert refused.returncode == 1 and refused.stderr.startswith(
        f"cgctl: error: {path}: components[1].image: 'b' names no image and none was given"), refused.stderr
    assert cluster.objects(PCS) == []
    applied = cgctl(kubeconfig, "--kubernetes", "apply", "-f", str(path), "--image", "example/b:1")
    assert applied.returncode == 0, applied.stderr
    (pcs,) = cluster.objects(PCS)
    assert [t["name"] for t in pcs["spec"]["template"]["resourceClaimTemplates"]] == ["gpu"]
    pods = {c["name"]: c["spec"]["podSpec"] for c in pcs["spec"]["template"]["cliques"]}
    assert pods["a"]["containers"][0]["image"] == "example/a:1" and pods["a"]["activeDeadlineSeconds"] == 60
    assert pods["b"]["containers"][0]["image"] == "example/b:1"
    (tmp_path / "claims" / "gpu.toml").unlink()
    gone = cgctl(kubeconfig, "--kubernetes", "apply", "-f", str(path), "--image", "example/b:1")
    assert gone.returncode == 1 and gone.stderr.count("\n") == 1 and "claims/gpu.toml" in gone.stderr


def test_list_shows_the_groups_and_why_one_waits(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def make() -> None:
        provider = KubernetesComputeResourceProvider(kubeconfig=kubeconfig, allocation_timeout_s=0.3, poll_s=0.02)
        try:
            m = ComputeGroupManager(provider)
            await m.allocate_compute_group("train", {"gpus": 2})
            cluster.scheduling = "hold"
            await m.allocate_compute_group("big", {"gpus": 8})
        finally:
            await provider.close()

    asyncio.run(make())
    shown = cgctl(kubeconfig, "--kubernetes", "list")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["GROUP", "COMPONENT", "STATE", "NODE", "GPUS"]
    assert lines[1].split() == ["big-0", "big", "pending", "-", "-"]
    assert lines[2].split()[:4] == ["train-0", "train", "allocated", "dgx-h100"]
    assert " ".join(lines[4:]).replace("     ", " ") == f"big-0 waits: {HOLD_REASON}".replace("     ", " ")
    assert narrow(shown.stdout)
    found = json.loads(cgctl(kubeconfig, "--json", "--kubernetes", "list").stdout)
    assert [c["state"] for c in found["components"]] == ["scheduling", "allocated"]


def test_failures_are_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    missing = cgctl(tmp_path / "no-such-kubeconfig", "--kubernetes", "list", home=tmp_path)
    assert missing.returncode == 1 and missing.stderr.startswith("cgctl: error: ")
    assert "kubeconfig" in missing.stderr and missing.stderr.count("\n") == 1

    silent = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    down = cgctl(silent, "--kubernetes", "list")
    assert down.returncode == 1 and down.stderr.count("\n") == 1
    assert down.stderr.startswith("cgctl: error: cannot reach the cluster's API server at http://127.0.0.1:9: ")

    other = cgctl(silent, "--kubernetes", "topo")
    assert other.returncode == 2 and "topo: not a --kubernetes command" in other.stderr
    alone = cgctl(silent, "--namespace", "x", "list")
    assert alone.returncode == 2 and "--context and --namespace go with --kubernetes" in alone.stderr


def test_without_lightkube_cgctl_says_how_to_install_it(tmp_path: Path) -> None:
    """lightkube hidden from the interpreter, as on a machine without the extra."""
    code = ("import sys; sys.modules['lightkube'] = None; sys.argv = ['cgctl', '--kubernetes', 'list']; "
            "from computegroups.cli.main import main; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "KUBECONFIG": str(tmp_path / "none")})
    assert done.returncode == 1
    assert done.stderr == "cgctl: error: --kubernetes needs lightkube: pip install 'computegroups[kubernetes]'\n"


def test_events_prints_the_clusters_changes_as_cgds_event_lines(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    """`cgctl --kubernetes events`: the command itself, then as cgctl runs it."""
    from click.testing import CliRunner

    from computegroups.cli.context import CliContext
    from computegroups.cli.kubernetes_cmds import events

    async def allocate() -> None:
        provider = KubernetesComputeResourceProvider(kubeconfig=kubeconfig, poll_s=0.02)
        try:
            await ComputeGroupManager(provider).allocate_compute_group("train", {"gpus": 1})
        finally:
            await provider.close()

    asyncio.run(allocate())
    env = {"KUBECONFIG": str(kubeconfig)}
    shown = CliRunner().invoke(events, [], obj=CliContext(kubernetes=True), env=env)
    assert shown.exit_code == 0, shown.output
    (line,) = shown.output.splitlines()
    assert line.endswith("group train-0 allocated on dgx-h100: GPUs 0") and narrow(shown.output)
    as_json = CliRunner().invoke(events, [], obj=CliContext(kubernetes=True, json=True), env=env)
    (event,) = [json.loads(x) for x in as_json.output.splitlines()]
    assert (event["type"], event["group"], event["gpus"]) == ("allocated", "train-0", [0])
    after = CliRunner().invoke(events, ["--since", str(event["seq"])], obj=CliContext(kubernetes=True), env=env)
    assert after.exit_code == 0 and after.output == ""
    registered = cgctl(kubeconfig, "--kubernetes", "events")
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.split(None, 1)[1] == shown.output.split(None, 1)[1], "the same line, but its time"
