"""The local path never imports lightkube: it is the optional `kubernetes` extra.

Each check runs in a fresh interpreter, where lightkube is installed (the
test extra), so an import that slipped into the local client, cgctl or the
daemon would show up in `sys.modules`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def loaded_after(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("lightkube", "kmock")})))
    """)], capture_output=True, text=True, timeout=120, check=False, env=ROOT_ENV)
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return names


def test_lightkube_is_installed_here_so_the_checks_below_mean_something() -> None:
    pytest.importorskip("lightkube", reason="without lightkube installed there is nothing to leak")
    assert loaded_after("import computegroups.daemon.kubernetes.provider") == ["lightkube"]


@pytest.mark.parametrize("code", [
    "from computegroups.daemon.client import ComputeGroupManager, LocalComputeResourceProvider, CgdClient\n"
    "import computegroups.daemon.client.aio, computegroups.daemon.client.models",
    "from computegroups.cli.main import cli\n"
    "from click.testing import CliRunner\n"
    "assert CliRunner().invoke(cli, ['--help']).exit_code == 0\n"
    "import computegroups.cli.deploy, computegroups.cli.status, computegroups.cli.allocate",
    "import computegroups.daemon.main, computegroups.daemon.lifecycle, computegroups.daemon.api.server",
    "import computegroups.daemon.kubernetes.cluster_errors",
], ids=["local-client", "cgctl", "daemon", "cluster-errors"])
def test_the_local_path_does_not_import_lightkube(code: str) -> None:
    assert loaded_after(code) == []


def test_without_lightkube_the_provider_class_says_how_to_install_it() -> None:
    """The one path cgctl and programs share: `provider_class()` tells a missing extra by name."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys; sys.modules["lightkube"] = None
        from computegroups.daemon.kubernetes import provider_class
        from computegroups.daemon.kubernetes.cluster_errors import KubernetesExtraMissing
        try:
            provider_class()
        except KubernetesExtraMissing as exc:
            print(exc)
    """)], capture_output=True, text=True, timeout=120, check=False, env=ROOT_ENV)
    assert done.stdout == "the Kubernetes provider needs lightkube: pip install 'computegroups[kubernetes]'\n", \
        done.stderr
