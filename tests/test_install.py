"""What `pip install computegroups` puts on a machine.

The repository keeps its folders (`daemon/`, `cli/`, ...) but installs them
under one import root, `computegroups`, so that the project can sit beside
python-daemon (whose package is a top-level `daemon`, pulled in by Airflow
and others) without overwriting it. The short public names of the root
package load lazily, so `cgctl` does not pay for the client library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, python: str = sys.executable, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([python, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_importing_the_root_package_loads_no_client() -> None:
    done = _python("""
        import sys
        import computegroups
        assert "ComputeGroupManager" in computegroups.__all__
        print([m for m in sys.modules if m.startswith("computegroups.") ])
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_short_names_resolve_on_first_use() -> None:
    done = _python("""
        import computegroups
        from computegroups.daemon.client.manager import ComputeGroupManager
        from computegroups.daemon.client.sync import CgdClient
        assert computegroups.ComputeGroupManager is ComputeGroupManager
        assert computegroups.CgdClient is CgdClient
        try:
            computegroups.NoSuchName
        except AttributeError as exc:
            print(exc)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "module 'computegroups' has no attribute 'NoSuchName'"


def test_cgctl_help_does_not_import_the_manager() -> None:
    """`cgctl` talks to cgd through the small synchronous client; the
    ComputeGroupManager (and its providers) stay unloaded."""
    done = _python("""
        import sys
        from computegroups.cli.main import main
        sys.argv = ["cgctl", "--help"]
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        loaded = sorted(m for m in sys.modules if m.startswith("computegroups.daemon.client."))
        print(loaded, file=sys.stderr)
        print("computegroups.daemon.client.manager" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "False", done.stderr


def _pip(python: Path, *args: str, cwd: Path) -> str:
    done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv (no system site-packages) with python-daemon, then
    computegroups built from this checkout as a wheel, installed as a user
    would. pip's own cache makes the dependencies quick after the first run."""
    root = tmp_path_factory.mktemp("install")
    wheels = root / "wheels"
    _pip(Path(sys.executable), "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(ROOT), cwd=root)
    built = sorted(wheels.glob("computegroups-*.whl"))
    assert len(built) == 1, built
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _pip(python, "install", "--quiet", "python-daemon", cwd=root)
    _pip(python, "install", "--quiet", str(built[0]), cwd=root)
    yield env_dir


@pytest.mark.slow
def test_pip_check_is_clean_beside_python_daemon(installed: Path) -> None:
    out = _pip(installed / "bin" / "python", "check", cwd=installed)
    assert "No broken requirements found" in out


@pytest.mark.slow
def test_python_daemon_and_computegroups_both_import(installed: Path) -> None:
    done = _python("""
        import sys
        import daemon
        import computegroups
        from computegroups.daemon.client import CgdClient
        assert daemon.DaemonContext, "python-daemon's package"
        assert computegroups.ComputeGroupManager.__name__ == "ComputeGroupManager"
        assert CgdClient.__module__.startswith("computegroups.daemon.client")
        print(daemon.__file__)
        print(computegroups.__file__)
    """, python=str(installed / "bin" / "python"), cwd=installed)
    assert done.returncode == 0, done.stderr
    daemon_file, root_file = (Path(line) for line in done.stdout.splitlines())
    site = installed / "lib"
    assert daemon_file.is_relative_to(site) and daemon_file.parent.name == "daemon", daemon_file
    assert root_file.is_relative_to(site) and root_file.parent.name == "computegroups", root_file


@pytest.mark.slow
@pytest.mark.parametrize("command", ["cgd", "cgctl"])
def test_entry_points_run(installed: Path, command: str) -> None:
    done = subprocess.run([str(installed / "bin" / command), "--version"], cwd=installed, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{command}, version "), done.stdout
