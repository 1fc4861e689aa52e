"""Machine files: a whole box described in a few lines of TOML.

The fake NVML answers from these, so after loading they must say everything
the hardware would report, down to the remote PCI bus id of every NVLink port,
while the file itself stays short enough to write by hand for one's own box
(a GPU template, overrides, link rules). This module expands the compact form
into a fully explicit `MachineSpec` and rejects anything wrong with the file
and the field in the message. The format is documented in
`docs/machine-files.md`.
"""

from __future__ import annotations

import re
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from computegroups.topology.model import PcieLevel
from computegroups.topology.ranges import parse_ranges

MACHINES_DIR = ("computegroups.topology", "machines")
MAX_GPUS = 1024


class MachineFileError(ValueError):
    """A machine file that cannot be loaded; the message names file and field."""


@dataclass(frozen=True)
class MigSpec:
    profile: str
    memory_mib: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    slices: int | None = None
    multiprocessors: int | None = None


@dataclass(frozen=True)
class PortSpec:
    """One active NVLink port as the GPU reports it: who is at the other end."""

    remote_bus_id: str
    remote_is_switch: bool


@dataclass(frozen=True)
class GpuSpec:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: tuple[int, int] | None
    multiprocessors: int | None
    numa_node: int | None
    cpu_affinity: tuple[int, ...] | None
    mig_capable: bool
    mig: tuple[MigSpec, ...]
    ports: tuple[PortSpec | None, ...]
    temperature_c: int
    unsupported: frozenset[str]


@dataclass(frozen=True)
class MachineSpec:
    """A machine file after expansion: nothing left to infer."""

    name: str
    label: str
    hostname: str
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[GpuSpec, ...]
    pcie: Mapping[tuple[int, int], PcieLevel]
    switch_bus_ids: tuple[str, ...]

    def pcie_level(self, a: int, b: int) -> PcieLevel:
        if a == b:
            return PcieLevel.INTERNAL
        return self.pcie[(min(a, b), max(a, b))]


def simulated_machine_names() -> tuple[str, ...]:
    """The machines shipped with the package, for `--simulate NAME`."""
    folder = resources.files(MACHINES_DIR[0]).joinpath(MACHINES_DIR[1])
    return tuple(sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml")))


def resolve_machine_file(name_or_path: str) -> tuple[Path, str]:
    """A shipped name or a path to a file -> (path, label used in messages)."""
    if name_or_path in simulated_machine_names():
        ref = resources.files(MACHINES_DIR[0]).joinpath(MACHINES_DIR[1], f"{name_or_path}.toml")
        return Path(str(ref)), f"{name_or_path}.toml"
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path, str(name_or_path)
    raise MachineFileError(
        f"{name_or_path}: no such simulated machine or machine file; shipped machines: "
        + ", ".join(simulated_machine_names())
    )


def load_machine_spec(name_or_path: str) -> MachineSpec:
    path, label = resolve_machine_file(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise MachineFileError(f"{label}: cannot read: {err.strerror or err}") from None
    return parse_machine_file(text, label, default_name=path.stem)


def parse_machine_file(text: str, label: str, default_name: str = "machine") -> MachineSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise MachineFileError(f"{label}: not valid TOML: {err}") from None
    return _Parser(label).machine(data, default_name)


_TOP_KEYS = {
    "name", "hostname", "driver_version", "cuda_driver_version", "gpu_count",
    "pci_bus_ids", "gpu_defaults", "gpus", "numa", "pcie", "nvlink", "nvswitch",
}
_GPU_KEYS = {
    "name", "memory_mib", "compute_capability", "multiprocessors", "uuid", "pci_bus_id",
    "cpu_affinity", "mig_capable", "mig", "nvlink_ports", "temperature_c", "unsupported",
}
_MIG_KEYS = {"profile", "memory_mib", "count", "gpu_instance_id", "compute_instance_id",
             "multiprocessors", "slices"}
_BUS_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_PAIR_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_MISSING: Any = object()


def normalize_bus_id(text: str) -> str:
    """NVML's form, `00000000:1A:00.0`, so file ids compare with reported ones."""
    m = _BUS_RE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a PCI bus id like 0000:1a:00.0")
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Parser:
    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, path: str, message: str) -> NoReturn:
        raise MachineFileError(f"{self.label}: {path}: {message}")

    # -- typed readers: every value is checked where it is written --------
    def keys(self, table: Mapping[str, Any], path: str, allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                self.fail(_join(path, key), "unknown field; known: " + ", ".join(sorted(allowed)))

    def required(self, table: Mapping[str, Any], key: str, path: str, hint: str = "") -> Any:
        if key not in table:
            self.fail(_join(path, key), "missing" + (f" ({hint})" if hint else ""))
        return table[key]

    def integer(self, value: Any, path: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, "expected an integer")
        if value < minimum:
            self.fail(path, f"expected an integer >= {minimum}")
        return value

    def string(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(path, "expected a non-empty string")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "expected true or false")
        return value

    def table(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, "expected a table")
        return value

    def array(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, "expected an array")
        return value

    def indices(self, value: Any, path: str, limit: int | None = None) -> tuple[int, ...]:
        if isinstance(value, str):
            try:
                out = parse_ranges(value)
            except ValueError as err:
                self.fail(path, str(err))
        elif isinstance(value, list):
            out = tuple(sorted({self.integer(v, f"{path}[{i}]") for i, v in enumerate(value)}))
        elif isinstance(value, int) and not isinstance(value, bool):
            out = (self.integer(value, path),)
        else:
            self.fail(path, 'expected indices like "0-3,6" or a list of integers')
        if limit is not None and out and out[-1] >= limit:
            self.fail(path, f"index {out[-1]} out of range: there are {limit} GPUs")
        return out

    def bus_id(self, value: Any, path: str) -> str:
        try:
            return normalize_bus_id(self.string(value, path))
        except ValueError as err:
            self.fail(path, str(err))

    def level(self, value: Any, path: str) -> PcieLevel:
        try:
            return PcieLevel.from_label(self.string(value, path))
        except ValueError as err:
            self.fail(path, str(err))

    def pair(self, key: str, path: str, count: int) -> tuple[int, int]:
        m = _PAIR_RE.match(key)
        if not m:
            self.fail(path, 'expected a GPU pair like "0-1"')
        a, b = int(m.group(1)), int(m.group(2))
        if a == b or max(a, b) >= count:
            self.fail(path, f"not a pair of two distinct GPUs below {count}")
        return (min(a, b), max(a, b))

    # -- the machine ------------------------------------------------------
    def machine(self, data: dict[str, Any], default_name: str) -> MachineSpec:
        self.keys(data, "", _TOP_KEYS)
        name = self.string(data.get("name", default_name), "name")
        hostname = self.string(data.get("hostname", name), "hostname")
        driver = data.get("driver_version")
        if driver is not None:
            driver = self.string(driver, "driver_version")
        cuda = self.cuda_version(data.get("cuda_driver_version"))
        count = self.integer(self.required(data, "gpu_count", "", "0 for a machine without GPUs"),
                             "gpu_count")
        if count > MAX_GPUS:
            self.fail("gpu_count", f"at most {MAX_GPUS}")
        fields = self.gpu_fields(count, data)
        numa, cpus = self.numa(data.get("numa", []), count)
        bus_ids = self.gpu_bus_ids(data.get("pci_bus_ids"), fields, count)
        switch_bus, switch_ports = self.nvswitches(data.get("nvswitch", []), count, len(bus_ids))
        direct = self.nvlinks(self.table(data.get("nvlink", {}), "nvlink"), count)
        pcie = self.pcie(self.table(data.get("pcie", {}), "pcie"), count, numa)
        taken = set(bus_ids)
        for bus in switch_bus:
            if bus in taken:
                self.fail("nvswitch", f"PCI bus id {bus} is used twice")
            taken.add(bus)
        gpus = tuple(
            self.gpu(i, fields[i], name, bus_ids, numa.get(i), cpus.get(i),
                     switch_ports.get(i, []), direct)
            for i in range(count)
        )
        seen: dict[str, int] = {}
        for g in gpus:
            for u in (g.uuid, *(m.uuid for m in g.mig)):
                if u in seen:
                    self.fail(f"gpus[{g.index}].uuid", f"{u} is also used by GPU {seen[u]}")
                seen[u] = g.index
        return MachineSpec(name, self.label, hostname, driver, cuda, gpus, pcie, tuple(switch_bus))

    def cuda_version(self, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, str):
            m = re.match(r"^(\d+)\.(\d)$", value.strip())
            if not m:
                self.fail("cuda_driver_version", 'expected "MAJOR.MINOR" like "12.4" or NVML\'s 12040')
            return int(m.group(1)) * 1000 + int(m.group(2)) * 10
        return self.integer(value, "cuda_driver_version", minimum=1000)

    def gpu_fields(self, count: int, data: dict[str, Any]) -> list[dict[str, tuple[Any, str]]]:
        """Template, then overrides in file order; each value keeps the path it came from."""
        template = self.table(data.get("gpu_defaults", {}), "gpu_defaults")
        self.keys(template, "gpu_defaults", _GPU_KEYS - {"uuid", "pci_bus_id"})
        fields = [{k: (v, f"gpu_defaults.{k}") for k, v in template.items()} for _ in range(count)]
        overrides = self.table(data.get("gpus", {}), "gpus")
        for key, table in overrides.items():
            where = f"gpus[{key}]"
            targets = self.indices(key, where, limit=count)
            table = self.table(table, where)
            allowed = _GPU_KEYS if len(targets) == 1 else _GPU_KEYS - {"uuid", "pci_bus_id"}
            self.keys(table, where, allowed)
            for i in targets:
                fields[i].update({k: (v, f"{where}.{k}") for k, v in table.items()})
        return fields

    def gpu_bus_ids(self, value: Any, fields: list[dict[str, tuple[Any, str]]],
                    count: int) -> list[str]:
        if value is None:
            ids = [f"{i // 16:08X}:{0x10 + (i % 16) * 0x0C:02X}:00.0" for i in range(count)]
        else:
            given = self.array(value, "pci_bus_ids")
            if len(given) != count:
                self.fail("pci_bus_ids", f"expected {count} bus ids, one per GPU, got {len(given)}")
            ids = [self.bus_id(v, f"pci_bus_ids[{i}]") for i, v in enumerate(given)]
        for i, f in enumerate(fields):
            if "pci_bus_id" in f:
                ids[i] = self.bus_id(*f["pci_bus_id"])
        for i, bus in enumerate(ids):
            if bus in ids[:i]:
                self.fail(f"gpus[{i}].pci_bus_id", f"{bus} is also GPU {ids.index(bus)}'s")
        return ids

    def numa(self, value: Any, count: int) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
        node_of: dict[int, int] = {}
        cpus_of: dict[int, tuple[int, ...]] = {}
        seen: set[int] = set()
        for n, entry in enumerate(self.array(value, "numa")):
            where = f"numa[{n}]"
            entry = self.table(entry, where)
            self.keys(entry, where, {"node", "cpus", "gpus"})
            node = self.integer(entry.get("node", n), f"{where}.node")
            if node in seen:
                self.fail(f"{where}.node", f"NUMA node {node} is listed twice")
            seen.add(node)
            cpus = self.indices(entry["cpus"], f"{where}.cpus") if "cpus" in entry else ()
            for g in self.indices(entry.get("gpus", []), f"{where}.gpus", limit=count):
                if g in node_of:
                    self.fail(f"{where}.gpus", f"GPU {g} is already on NUMA node {node_of[g]}")
                node_of[g] = node
                if cpus:
                    cpus_of[g] = cpus
        return node_of, cpus_of

    def nvswitches(self, value: Any, count: int,
                   first_bus: int) -> tuple[list[str], dict[int, list[PortSpec]]]:
        buses: list[str] = []
        ports: dict[int, list[PortSpec]] = {}
        for f, entry in enumerate(self.array(value, "nvswitch")):
            where = f"nvswitch[{f}]"
            entry = self.table(entry, where)
            self.keys(entry, where, {"gpus", "links_per_switch", "pci_bus_ids", "overrides"})
            if "gpus" not in entry or "links_per_switch" not in entry:
                self.fail(where, "needs gpus and links_per_switch")
            members = self.indices(entry["gpus"], f"{where}.gpus", limit=count)
            lps = self.link_counts(entry["links_per_switch"], f"{where}.links_per_switch", None)
            if "pci_bus_ids" in entry:
                ids = self.array(entry["pci_bus_ids"], f"{where}.pci_bus_ids")
                if len(ids) != len(lps):
                    self.fail(f"{where}.pci_bus_ids", f"expected {len(lps)}, one per switch")
                fabric = [self.bus_id(v, f"{where}.pci_bus_ids[{k}]") for k, v in enumerate(ids)]
            else:
                fabric = [f"00000000:{0xE0 + (len(buses) + k) % 0x20:02X}:00.0" for k in range(len(lps))]
            per_gpu = {g: lps for g in members}
            for key, counts in self.table(entry.get("overrides", {}), f"{where}.overrides").items():
                path = f"{where}.overrides.{key}"
                for g in self.indices(key, path, limit=count):
                    if g not in per_gpu:
                        self.fail(path, f"GPU {g} is not in this switch fabric's gpus")
                    per_gpu[g] = self.link_counts(counts, path, len(lps))
            for g, counts in per_gpu.items():
                for bus, n in zip(fabric, counts, strict=True):
                    ports.setdefault(g, []).extend([PortSpec(bus, True)] * n)
            buses.extend(fabric)
        return buses, ports

    def link_counts(self, value: Any, path: str, length: int | None) -> list[int]:
        counts = [self.integer(v, f"{path}[{k}]") for k, v in enumerate(self.array(value, path))]
        if not counts or (length is not None and len(counts) != length):
            self.fail(path, f"expected {length or 'one or more'} link counts, one per switch")
        return counts

    def nvlinks(self, table: dict[str, Any], count: int) -> dict[tuple[int, int], int]:
        self.keys(table, "nvlink", {"pairs", "mesh"})
        links: dict[tuple[int, int], int] = {}
        for m, entry in enumerate(self.array(table.get("mesh", []), "nvlink.mesh")):
            where = f"nvlink.mesh[{m}]"
            entry = self.table(entry, where)
            self.keys(entry, where, {"gpus", "links"})
            members = self.indices(entry.get("gpus", []), f"{where}.gpus", limit=count)
            n = self.integer(self.required(entry, "links", where), f"{where}.links", 1)
            for i, a in enumerate(members):
                for b in members[i + 1:]:
                    links[(a, b)] = n
        for key, n in self.table(table.get("pairs", {}), "nvlink.pairs").items():
            path = f"nvlink.pairs.{key}"
            links[self.pair(key, path, count)] = self.integer(n, path, 0)
        return {p: n for p, n in links.items() if n}

    def pcie(self, table: dict[str, Any], count: int,
             numa: dict[int, int]) -> dict[tuple[int, int], PcieLevel]:
        self.keys(table, "pcie", {"same_numa", "cross_numa", "groups", "pairs"})
        same = self.level(table.get("same_numa", "NODE"), "pcie.same_numa")
        cross = self.level(table.get("cross_numa", "SYS"), "pcie.cross_numa")
        levels: dict[tuple[int, int], PcieLevel] = {}
        for a in range(count):
            for b in range(a + 1, count):
                on_same = a in numa and numa.get(a) == numa.get(b)
                levels[(a, b)] = same if on_same else cross
        grouped: dict[tuple[int, int], PcieLevel] = {}
        for label, groups in self.table(table.get("groups", {}), "pcie.groups").items():
            path = f"pcie.groups.{label}"
            level = self.level(label, path)
            for k, group in enumerate(self.array(groups, path)):
                members = self.indices(group, f"{path}[{k}]", limit=count)
                for i, a in enumerate(members):
                    for b in members[i + 1:]:
                        grouped[(a, b)] = min(level, grouped.get((a, b), level))
        levels.update(grouped)
        for key, label in self.table(table.get("pairs", {}), "pcie.pairs").items():
            path = f"pcie.pairs.{key}"
            levels[self.pair(key, path, count)] = self.level(label, path)
        return levels

    # -- one GPU ----------------------------------------------------------
    def gpu(self, index: int, fields: dict[str, tuple[Any, str]], machine: str,
            bus_ids: list[str], numa: int | None, cpus: tuple[int, ...] | None,
            switch_ports: list[PortSpec], direct: dict[tuple[int, int], int]) -> GpuSpec:
        def get(key: str, default: Any = _MISSING) -> tuple[Any, str]:
            if key in fields:
                return fields[key]
            if default is _MISSING:
                self.fail(f"gpus[{index}].{key}", f"missing (set it in [gpu_defaults] or [gpus.{index}])")
            return default, f"gpus[{index}].{key}"

        name = self.string(*get("name"))
        memory = self.integer(*get("memory_mib"), minimum=1)
        cc = self.capability(*get("compute_capability", None))
        sms_value, sms_path = get("multiprocessors", None)
        sms = None if sms_value is None else self.integer(sms_value, sms_path, 1)
        uuid_value, uuid_path = get("uuid", None)
        gpu_uuid = (self.string(uuid_value, uuid_path) if uuid_value is not None
                    else _make_uuid("GPU", machine, index))
        affinity_value, affinity_path = get("cpu_affinity", None)
        affinity = cpus if affinity_value is None else self.indices(affinity_value, affinity_path)
        mig = self.migs(*get("mig", []), index=index, machine=machine, memory=memory)
        capable_value, capable_path = get("mig_capable", bool(mig))
        capable = self.boolean(capable_value, capable_path)
        if mig and not capable:
            self.fail(capable_path, "MIG instances are listed but mig_capable is false")
        ports = list(switch_ports)
        peers = sorted((b if a == index else a, n) for (a, b), n in direct.items() if index in (a, b))
        for peer, n in peers:
            ports.extend([PortSpec(bus_ids[peer], False)] * n)
        ports_value, ports_path = get("nvlink_ports", len(ports))
        n_ports = self.integer(ports_value, ports_path)
        if n_ports < len(ports):
            self.fail(ports_path, f"GPU {index} uses {len(ports)} NVLinks but has {n_ports} ports")
        unsupported_value, unsupported_path = get("unsupported", [])
        unsupported = frozenset(
            self.string(v, f"{unsupported_path}[{k}]")
            for k, v in enumerate(self.array(unsupported_value, unsupported_path))
        )
        return GpuSpec(
            index=index, uuid=gpu_uuid, name=name, memory_mib=memory, pci_bus_id=bus_ids[index],
            compute_capability=cc, multiprocessors=sms, numa_node=numa, cpu_affinity=affinity or None,
            mig_capable=capable, mig=mig,
            ports=tuple(ports) + (None,) * (n_ports - len(ports)),
            temperature_c=self.integer(*get("temperature_c", 35)),
            unsupported=unsupported,
        )

    def capability(self, value: Any, path: str) -> tuple[int, int] | None:
        if value is None:
            return None
        if isinstance(value, str) and re.match(r"^\d+\.\d+$", value.strip()):
            major, minor = value.strip().split(".")
            return (int(major), int(minor))
        if isinstance(value, list) and len(value) == 2:
            return (self.integer(value[0], f"{path}[0]"), self.integer(value[1], f"{path}[1]"))
        self.fail(path, 'expected "MAJOR.MINOR" like "9.0"')

    def migs(self, value: Any, path: str, *, index: int, machine: str,
             memory: int) -> tuple[MigSpec, ...]:
        """With `count`, `gpu_instance_id` is the first of consecutive ids, the
        way NVML numbers a row of same-sized instances."""
        out: list[MigSpec] = []
        next_free = 1
        for k, entry in enumerate(self.array(value, path)):
            where = f"{path}[{k}]"
            entry = self.table(entry, where)
            self.keys(entry, where, _MIG_KEYS)
            profile = self.string(self.required(entry, "profile", where), f"{where}.profile")
            memory_mib = self.integer(self.required(entry, "memory_mib", where), f"{where}.memory_mib", 1)
            n = self.integer(entry.get("count", 1), f"{where}.count", 1)
            first = self.integer(entry.get("gpu_instance_id", next_free), f"{where}.gpu_instance_id")
            ci = self.integer(entry.get("compute_instance_id", 0), f"{where}.compute_instance_id")
            slices_match = re.match(r"^(\d+)g\.", profile)
            slices = entry.get("slices", int(slices_match.group(1)) if slices_match else None)
            sms = entry.get("multiprocessors")
            for gi in range(first, first + n):
                if any(m.gpu_instance_id == gi for m in out):
                    self.fail(f"{where}.gpu_instance_id", f"GPU instance {gi} is listed twice")
                out.append(MigSpec(
                    profile=profile, memory_mib=memory_mib, gpu_instance_id=gi,
                    compute_instance_id=ci, uuid=_make_uuid("MIG", machine, index, len(out)),
                    slices=None if slices is None else self.integer(slices, f"{where}.slices", 1),
                    multiprocessors=None if sms is None else self.integer(sms, f"{where}.multiprocessors", 1),
                ))
            next_free = max(m.gpu_instance_id for m in out) + 1
        if len(out) > 8:
            self.fail(path, f"{len(out)} MIG instances; a GPU has at most 8")
        if sum(m.memory_mib for m in out) > memory:
            self.fail(path, f"MIG instances need more than the GPU's {memory} MiB")
        return tuple(out)


def _make_uuid(kind: str, machine: str, *parts: int) -> str:
    """Stable across runs so state files written on a simulated box stay valid."""
    key = ":".join(["computegroups", machine, *map(str, parts)])
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_URL, key)}"
