"""A deployment file includes claims from other files, as Grove references external ResourceClaimTemplates.

The client reads the included files (never cgd: it may be root) and sends
their content beside the file; cgd checks and merges them, and every
refusal names the file the problem is in.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from computegroups.daemon.client import CgdClient, CgdError
from computegroups.daemon.client.deployfile import load_deployment
from tests.daemon.core.test_groups_e2e import ok, refused
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
GPU_CLAIMS = '[[claims]]\nname = "kv"\nmemory = "2GiB"\n\n[[claims]]\nname = "rank"\nmemory = "1GiB"\n'


def deployment(tmp_path: Path, name: str = "inc", claims: str = "") -> Path:
    (tmp_path / "claims").mkdir(exist_ok=True)
    (tmp_path / "claims" / "gpu.toml").write_text(GPU_CLAIMS)
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'name = "{name}"\ninclude = ["claims/gpu.toml"]\n{claims}\n'
        f'[[components]]\nname = "w"\ncommand = [{json.dumps(sys.executable)}, "-c", "import time; time.sleep(3600)"]\n'
        'sharing = [{ claim = "kv", scope = "all-replicas" }, { claim = "rank", scope = "per-replica" }]\n')
    return path


def test_claims_come_from_an_included_file(cgd: Cgd, tmp_path: Path) -> None:
    path = deployment(tmp_path)
    assert ok(cgd, "apply", "-f", str(path)).startswith("deployment inc created: 2 groups, 1 workers")
    _, kv = cgd.request("GET", "/v1/groups/inc-0-w-all-kv")
    assert kv["claim"]["memory_mib"] == 2048
    assert ok(cgd, "apply", "-f", str(path)).startswith("deployment inc unchanged"), "the same again"

    state = cgd.state()
    (tmp_path / "claims" / "gpu.toml").write_text(GPU_CLAIMS.replace('"1GiB"', '"3GiB"'))
    err = refused(cgd, "apply", "-f", str(path))
    assert "claims/gpu.toml: field is immutable: claims[1].memory" in err, (
        "an included claim is a claim of the deployment, named by its own file and index", err)
    (tmp_path / "claims" / "gpu.toml").write_text(GPU_CLAIMS)
    (tmp_path / "claims" / "gpu.toml").write_text(GPU_CLAIMS + '\n[[components]]\nname = "x"\n')
    err = refused(cgd, "apply", "-f", str(path))
    assert "claims/gpu.toml: components: unknown field (known: claims)" in err, err
    (tmp_path / "claims" / "gpu.toml").write_text(GPU_CLAIMS.replace('"2GiB"', '"lots"'))
    err = refused(cgd, "apply", "-f", str(path))
    assert "claims/gpu.toml: claims[0].memory: not a size: 'lots'" in err, err
    (tmp_path / "claims" / "gpu.toml").unlink()
    err = refused(cgd, "apply", "-f", str(path))
    assert f"{tmp_path / 'claims' / 'gpu.toml'}: No such file or directory" in err, err
    twice = deployment(tmp_path, "twice", '[[claims]]\nname = "kv"\nmemory = "1GiB"\n')
    err = refused(cgd, "apply", "-f", str(twice))
    assert f"{twice}: claims[0].name: claim 'kv' is defined in claims/gpu.toml too" in err, err
    assert cgd.state() == state, "refusals change nothing"

    own = deployment(tmp_path, "own", '[[claims]]\nname = "extra"\nmemory = "1GiB"\n')
    ok(cgd, "apply", "-f", str(own))
    own.write_text(own.read_text().replace('name = "extra"\nmemory = "1GiB"', 'name = "extra"\nmemory = "3GiB"'))
    err = refused(cgd, "apply", "-f", str(own))
    assert f"{own}: field is immutable: claims[0].memory" in err, ("the file's own claims[0], after 2 included", err)

    status, reply = cgd.request("POST", "/v1/deployments", {"spec": {"name": "raw", "include": ["a.toml"]},
                                                            "source": "/srv/raw.toml"})
    assert status == 400 and reply["error"]["message"] == (
        "/srv/raw.toml: include[0]: a.toml: its content was not sent (cgctl apply reads it)")

    (tmp_path / "py").mkdir()
    other = deployment(tmp_path / "py", "py")
    client = CgdClient(cgd.socket)
    body = load_deployment(str(other))
    assert body["included"] == {"claims/gpu.toml": {"claims": [{"name": "kv", "memory": "2GiB"},
                                                               {"name": "rank", "memory": "1GiB"}]}}
    result = client.apply_deployment(body)
    assert result["changes"]["created"] and sorted(result["changes"]["groups_created"]) == [
        "py-0-w-0-rank", "py-0-w-all-kv"]
    with pytest.raises(CgdError, match=r"include: claims/gpu\.toml: sent, but the file includes nothing"):
        client.apply_deployment({**body, "spec": {k: v for k, v in body["spec"].items() if k != "include"}})
