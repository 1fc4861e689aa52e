"""`cgctl render kubernetes` end to end: YAML on stdout, warnings on stderr, one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from computegroups.cli.main import cli
from computegroups.daemon.kubernetes.render import render_deployment
from tests.kubernetes.render_samples import GROVE_SHARING, IMAGE, ROOT, example


def cgctl(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="cgctl")


def test_prints_the_rendered_documents_as_yaml_and_the_warnings_on_stderr() -> None:
    done = cgctl("render", "kubernetes", "-f", str(GROVE_SHARING), "--image", IMAGE)
    assert done.exit_code == 0, done.stderr
    expected = render_deployment(example(), namespace="default", image=IMAGE)
    assert list(yaml.safe_load_all(done.stdout)) == expected.documents
    assert done.stdout.startswith("---\napiVersion: grove.io/v1alpha1\nkind: PodCliqueSet\n")
    warnings = [line for line in done.stderr.splitlines() if line.startswith("cgctl: warning: ")]
    assert len(warnings) == len(expected.warnings)
    assert any(w.startswith("cgctl: warning: components[1].shadow_of: ") for w in warnings)
    assert all(len(line) <= 80 for line in done.stderr.splitlines())
    assert " ".join(done.stderr.split()) == " ".join(" ".join(f"cgctl: warning: {w}" for w in expected.warnings)
                                                     .split())


def test_the_files_include_names_are_read_as_cgctl_apply_reads_them(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "gpu.toml").write_text('[[claims]]\nname = "gpu"\ngpus = 2\n')
    path = tmp_path / "d.toml"
    path.write_text('name = "inc"\ninclude = ["claims/gpu.toml"]\n[[components]]\nname = "a"\n'
                    'command = ["x"]\nsharing = [{claim = "gpu", scope = "per-replica"}]\n')
    done = cgctl("render", "kubernetes", "-f", str(path), "--image", IMAGE)
    assert done.exit_code == 0, done.stderr
    (pcs,) = yaml.safe_load_all(done.stdout)
    (template,) = pcs["spec"]["template"]["resourceClaimTemplates"]
    assert template["name"] == "gpu"
    assert template["templateSpec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    (tmp_path / "claims" / "gpu.toml").unlink()
    missing = cgctl("render", "kubernetes", "-f", str(path), "--image", IMAGE)
    assert missing.exit_code == 1 and missing.stdout == ""
    [line] = missing.stderr.splitlines()
    assert line.startswith("cgctl: error: ") and "claims/gpu.toml" in line, line


def test_namespace_and_mps_sharing() -> None:
    done = cgctl("render", "kubernetes", "-f", str(GROVE_SHARING), "--image", IMAGE, "-n", "ml",
                 "--sharing", "mps")
    assert done.exit_code == 0, done.stderr
    [pcs] = yaml.safe_load_all(done.stdout)
    assert pcs["metadata"]["namespace"] == "ml"
    configs = [t["templateSpec"]["spec"]["devices"].get("config") for t in pcs["spec"]["template"]
               ["resourceClaimTemplates"]]
    assert configs[0] is None  # set-pool: a whole GPU
    assert configs[1][0]["opaque"]["parameters"]["sharing"]["mpsConfig"] == {"defaultPinnedDeviceMemoryLimit": "2Gi"}
    assert "consumable capacity" not in done.stderr


def test_a_script_in_a_command_reads_as_a_literal_block() -> None:
    done = cgctl("render", "kubernetes", "-f", str(GROVE_SHARING), "--image", IMAGE)
    assert "- |-\n              import signal, time\n" in done.stdout


@pytest.mark.parametrize(("content", "extra", "message"), [
    ("name = [", (), "not valid TOML"),
    ('name = "d"\nreplicas = 1\ncolour = "red"\n[[components]]\nname = "w"\n', (), "colour"),
    ('name = "d"\n[[components]]\nname = "w"\n', ("--no-image",), "components[0].image: "),
    ('name = "d"\n[[components]]\nname = "w"\n', ("--namespace", "Not_A_Name"), "namespace: "),
])
def test_a_bad_file_or_option_is_one_line_and_a_failure(tmp_path: Path, content: str, extra: tuple[str, ...],
                                                        message: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text(content)
    args = ["render", "kubernetes", "-f", str(path)]
    args += [a for a in extra if a != "--no-image"]
    if "--no-image" not in extra:
        args += ["--image", IMAGE]
    done = cgctl(*args)
    assert done.exit_code == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"cgctl: error: {path}: ") and message in line, line


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = cgctl("render", "kubernetes", "-f", str(tmp_path / "none.toml"), "--image", IMAGE)
    assert done.exit_code == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("cgctl: error: ") and "none.toml" in line


def _cgctl_process(args: list[str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(f"""
        import sys
        {prelude}
        from computegroups.cli.main import main
        sys.argv = ["cgctl", *{args!r}]
        try:
            main()
        finally:
            print("lightkube loaded" if "lightkube" in sys.modules else "", file=sys.stderr)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_cgctl_renders_in_its_own_process_without_cgd_or_the_kubernetes_client() -> None:
    done = _cgctl_process(["--socket", "/nonexistent/cgd.sock", "render", "kubernetes", "-f",
                           str(GROVE_SHARING), "--image", IMAGE])
    assert done.returncode == 0, done.stderr
    assert [d["kind"] for d in yaml.safe_load_all(done.stdout)] == ["PodCliqueSet"]
    assert "cgctl: warning: components[1].shadow_of:" in done.stderr
    assert "lightkube loaded" not in done.stderr


def test_without_pyyaml_it_says_how_to_install_it() -> None:
    done = _cgctl_process(["render", "kubernetes", "-f", str(GROVE_SHARING), "--image", IMAGE],
                          prelude='sys.modules["yaml"] = None')
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines()[0] == (
        "cgctl: error: rendering YAML needs PyYAML: pip install 'computegroups[kubernetes]'")
