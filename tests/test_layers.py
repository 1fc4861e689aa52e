"""Every import runs downhill: a layer never imports one above it.

The layers are those of docs/architecture.md. This reads the import
statements of every module (top-level and deferred ones alike), so a new
import that runs uphill fails here with the module and the line named.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"daemon": "computegroups.daemon", "topology": "computegroups.topology", "cli": "computegroups.cli",
           "statefiles": "computegroups.statefiles"}

# Lowest first: a layer may import itself and the layers listed before it.
LAYERS = [
    ("topology", ["computegroups.topology"]),
    ("model", ["computegroups.daemon.model"]),
    ("kubernetes", ["computegroups.daemon.kubernetes"]),
    ("placement", ["computegroups.daemon.placement"]),
    ("statefiles", ["computegroups.statefiles"]),
    ("paths", ["computegroups.daemon.paths", "computegroups.daemon.sdnotify"]),
    ("supervision", ["computegroups.daemon.supervision"]),
    ("core", ["computegroups.daemon.core"]),
    ("deployments", ["computegroups.daemon.deployments"]),
    ("api", ["computegroups.daemon.api"]),
    ("daemon", ["computegroups.daemon.lifecycle", "computegroups.daemon.main"]),
]
CLIENT = ["computegroups.daemon.client"]
"""The Python client talks to cgd's socket: it may use paths (to find it), never the daemon's layers."""
CLI = ["computegroups.cli"]
"""cgctl talks to cgd through the client; it may read topology (`cgctl topo`) and use the model's
rules for what it sends (sizes), and render or apply Kubernetes manifests (daemon/kubernetes), never
the daemon's layers."""


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[:2] == ["daemon", "root"]:
        return "computegroups"
    parts[0] = FOLDERS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.startswith("computegroups")]


def layer_of(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def under(module: str, prefixes: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


MODULES = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_downhill(path: Path) -> None:
    me = module_name(path)
    mine = layer_of(me)
    uphill = []
    for line, name in imports(path):
        if name == "computegroups":
            continue  # the root package: the version and lazily resolved public names
        if under(name, CLI) and not under(me, CLI):
            uphill.append(f"line {line}: {name} (nothing imports the command line)")
        elif under(me, CLIENT):
            if not (under(name, CLIENT) or name == "computegroups.daemon.paths"):
                uphill.append(f"line {line}: {name} (the client only talks to the socket)")
        elif under(me, CLI):
            if not (under(name, CLI + CLIENT + ["computegroups.topology", "computegroups.daemon.model",
                                                "computegroups.daemon.kubernetes"])
                    or name == "computegroups.daemon.paths"):
                uphill.append(f"line {line}: {name} (cgctl talks to cgd's socket, not to the daemon's layers)")
        elif mine is not None:
            theirs = layer_of(name)
            if theirs is not None and theirs > mine:
                uphill.append(f"line {line}: {name} ({LAYERS[theirs][0]} is above {LAYERS[mine][0]})")
    assert not uphill, f"{me} imports uphill: " + "; ".join(uphill)


def test_every_module_has_a_layer() -> None:
    lost = [module_name(p) for p in MODULES
            if layer_of(module_name(p)) is None and not under(module_name(p), CLIENT + CLI)
            and module_name(p) not in ("computegroups", "computegroups.daemon")]
    assert not lost, f"modules in no layer of docs/architecture.md: {lost}"


GATEWAYS = {
    "pynvml": ("topology/nvml.py",),
    "circus": ("daemon/supervision/",),
    "psutil": ("daemon/supervision/", "statefiles/store.py"),
    "lightkube": ("daemon/kubernetes/provider", "daemon/kubernetes/cluster_objects.py"),
    "yaml": ("cli/kubernetes_render.py",),
    "prometheus_client": ("daemon/core/instruments.py", "daemon/core/metrics.py"),
}
"""Who may import the libraries that reach the driver, the processes, a cluster and Prometheus:
NVML through one gateway, processes through supervision (and the state store, which names a
stale lock's holder), the optional Kubernetes extra only in the provider (the local path never
loads it), YAML only where cgctl writes manifests, and the metrics library only where
cgd's metrics are defined and collected."""


@pytest.mark.parametrize("library", sorted(GATEWAYS))
def test_only_the_gateway_imports_the_driver_and_process_libraries(library: str) -> None:
    allowed = GATEWAYS[library]
    offenders = []
    for path in MODULES:
        rel = str(path.relative_to(ROOT))
        if rel.startswith(allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == library or n.startswith(library + ".") for n in names):
                offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, f"{library} imported outside {allowed}: {offenders}"
