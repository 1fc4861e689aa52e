"""docs/kubernetes.md shows what the code renders: its example is cgctl's output, byte for byte."""

from __future__ import annotations

import re

from click.testing import CliRunner

from computegroups.cli.main import cli
from tests.kubernetes.render_samples import IMAGE, ROOT

DOC = ROOT / "docs" / "kubernetes.md"
COMMAND = f"cgctl render kubernetes -f docs/examples/grove-sharing.toml --image {IMAGE}"


def example_blocks() -> tuple[str, str]:
    """The YAML and the stderr shown under the doc's "The example, rendered"."""
    section = DOC.read_text().split("## The example, rendered", 1)[1]
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S)
    text_block = re.search(r"```text\n(.*?)```", section, re.S)
    assert yaml_block and text_block, "docs/kubernetes.md lost its rendered example"
    assert COMMAND in section.split("```yaml", 1)[0]
    return yaml_block.group(1), text_block.group(1)


def test_the_docs_example_is_what_cgctl_renders() -> None:
    """On a difference, paste the output of the doc's command (run from the repository root) into it."""
    done = CliRunner().invoke(cli, COMMAND.split()[1:], prog_name="cgctl")
    assert done.exit_code == 0, done.stderr
    shown_yaml, shown_warnings = example_blocks()
    assert shown_yaml == done.stdout
    assert shown_warnings == done.stderr
