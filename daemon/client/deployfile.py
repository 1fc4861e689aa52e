"""Reading a deployment file and the files it includes, as `POST /v1/deployments` takes them.

The client reads the files, never cgd: a daemon that may run as root must not
open paths a caller names. `include = ["claims/gpu.toml"]` names files of
`[[claims]]` beside the deployment file (a relative path is relative to the
file that includes it); their content travels in the request's `included`,
keyed by the path as written, and cgd checks and merges them.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

Json = Any


class DeploymentFileError(ValueError):
    """A file that cannot be read or is not a plain TOML document; the message starts with its path."""


def load_deployment(path: str) -> dict[str, Json]:
    """The body of `POST /v1/deployments` for the file at `path`: `spec`, `source`, `included`."""
    spec = read_toml(path)
    body: dict[str, Json] = {"spec": spec, "source": os.path.abspath(path)}
    paths = spec.get("include")
    if isinstance(paths, list):
        base = os.path.dirname(os.path.abspath(path))
        body["included"] = {p: read_toml(os.path.join(base, p))
                            for p in paths if isinstance(p, str) and p}
    return body


def read_toml(path: str) -> dict[str, Json]:
    """The TOML file as JSON-ready data; a file that cannot be read or parsed fails with its name."""
    # The parser loads here, not with the module: `cgctl --help` and `scale` need none.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser, before it joined the standard library
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data: dict[str, Json] = tomllib.load(f)
    except OSError as exc:
        raise DeploymentFileError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise DeploymentFileError(f"{path}: not valid TOML: {exc}") from None
    _check_plain(data, path, "")
    return data


def _check_plain(value: Any, path: str, where: str) -> None:
    """TOML dates and times have no JSON form, and nothing in a deployment is one."""
    if isinstance(value, (datetime.date, datetime.time)):
        raise DeploymentFileError(f"{path}: {where or 'value'}: dates and times are not allowed in a deployment file")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(v, path, f"{where}.{k}" if where else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_plain(v, path, f"{where}[{i}]")
