"""The one function that turns a group into a worker's environment."""

from __future__ import annotations

import doctest
import os

import pytest

from computegroups.daemon.supervision import workerenv
from computegroups.daemon.supervision.workerenv import MpsSettings, OwnerEnv, VisibleDevice, owner_env, worker_env

ADA = OwnerEnv(uid=1000, gid=1000, user="ada", home="/home/ada", path="/home/ada/.local/bin:/usr/bin",
               lang="en_US.UTF-8")
GPU0 = VisibleDevice(0, "GPU-0000", None, 81559, 100, True)
GPU3 = VisibleDevice(3, "GPU-3333", None, 81559, 100, True)
MIG = VisibleDevice(1, "GPU-1111", "MIG-aaaa", 9856, 100, True)
HALF2 = VisibleDevice(2, "GPU-2222", None, 40000, 50, False)
QUARTER5 = VisibleDevice(5, "GPU-5555", None, 20000, 25, False)


def env_for(devices: list[VisibleDevice], **kw: object) -> dict[str, str]:
    args: dict[str, object] = dict(owner=ADA, devices=devices, component="web", replica=2, role="primary",
                                   groups=["web-2"], role_file="/run/computegroups/roles/web.2")
    args.update(kw)
    return worker_env(**args)  # type: ignore[arg-type]


def test_doctests() -> None:
    assert doctest.testmod(workerenv).failed == 0


def test_whole_gpus_by_index_in_pci_order() -> None:
    env = env_for([GPU3, GPU0])
    assert env == {
        "PATH": ADA.path, "HOME": "/home/ada", "USER": "ada", "LANG": "en_US.UTF-8",
        "CUDA_VISIBLE_DEVICES": "3,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CG_COMPONENT": "web", "CG_REPLICA": "2", "CG_GROUP": "web-2", "CG_ROLE": "primary",
        "CG_ROLE_FILE": "/run/computegroups/roles/web.2",
    }


def test_a_bound_worker_reads_its_cpus_in_the_kernels_list_format() -> None:
    assert env_for([GPU0], cpus=(0, 1, 2, 3, 112, 113))["CG_CPUS"] == "0-3,112-113"
    assert "CG_CPUS" not in env_for([GPU0])
    assert "CG_CPUS" not in env_for([], cpus=())


def test_uuid_naming_and_mig_always_by_uuid() -> None:
    assert env_for([GPU0, GPU3], naming="uuid")["CUDA_VISIBLE_DEVICES"] == "GPU-0000,GPU-3333"
    assert env_for([MIG], naming="uuid")["CUDA_VISIBLE_DEVICES"] == "MIG-aaaa"
    assert env_for([MIG, GPU0])["CUDA_VISIBLE_DEVICES"] == "MIG-aaaa,0"


def test_no_devices_hides_every_gpu() -> None:
    env = env_for([], groups=[])
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["CG_GROUP"] == ""


def test_shares_tell_the_budget_and_whole_devices_do_not() -> None:
    assert "CG_GPU_MEMORY_MIB" not in env_for([GPU0])
    one = env_for([HALF2])
    assert (one["CG_GPU_MEMORY_MIB"], one["CG_GPU_COMPUTE_PCT"]) == ("40000", "50")
    several = env_for([GPU0, HALF2, QUARTER5], groups=["a", "b"])
    assert several["CG_GPU_MEMORY_MIB"] == "81559,40000,20000"
    assert several["CG_GPU_COMPUTE_PCT"] == "100,50,25"
    assert several["CG_GROUP"] == "a,b"
    assert not any(k.startswith("CUDA_MPS") for k in several)


def test_mps_limits_use_the_ordinals_the_worker_sees() -> None:
    env = env_for([GPU0, HALF2, QUARTER5], mps=MpsSettings("/run/computegroups/mps"))
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/computegroups/mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "1=40000M,2=20000M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_mps_leaves_whole_devices_alone() -> None:
    env = env_for([GPU0], mps=MpsSettings("/run/mps"))
    assert not any(k.startswith("CUDA_MPS") for k in env)


def test_a_device_in_two_groups_appears_once() -> None:
    other_share = VisibleDevice(2, "GPU-2222", None, 10000, 30, False)
    env = env_for([HALF2, other_share, GPU0, GPU0])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert env["CG_GPU_MEMORY_MIB"] == "50000,81559"
    assert env["CG_GPU_COMPUTE_PCT"] == "80,100"
    assert env_for([HALF2, VisibleDevice(2, "GPU-2222", None, 81559, 100, True)])["CUDA_VISIBLE_DEVICES"] == "2"


def test_extra_env_adds_and_overrides_but_not_reserved_names() -> None:
    env = env_for([GPU0], extra={"MODEL": "llama", "PATH": "/opt/bin", "LANG": "C"})
    assert (env["MODEL"], env["PATH"], env["LANG"]) == ("llama", "/opt/bin", "C")
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CG_ROLE", "CG_ANYTHING"):
        with pytest.raises(ValueError, match=key):
            env_for([GPU0], extra={key: "x"})
    for bad in ({"A=B": "x"}, {"": "x"}, {"OK": "nul\0byte"}):
        with pytest.raises(ValueError):
            env_for([GPU0], extra=bad)


def test_the_users_own_cuda_variables_pass_and_the_loaders_only_for_other_users() -> None:
    """One rule with the model's (`requests.env_problem`): only what cgd itself sets is reserved."""
    env = env_for([GPU0], extra={"CUDA_HOME": "/opt/cuda", "CUDA_CACHE_PATH": "/tmp/c", "LD_PRELOAD": "/x.so"})
    assert (env["CUDA_HOME"], env["CUDA_CACHE_PATH"], env["LD_PRELOAD"]) == ("/opt/cuda", "/tmp/c", "/x.so")
    root = OwnerEnv(uid=0, gid=0, user="root", home="/root", path="/usr/bin", lang=None)
    assert env_for([GPU0], owner=root, extra={"CUDA_HOME": "/opt/cuda"})["CUDA_HOME"] == "/opt/cuda"
    for key in ("LD_PRELOAD", "LD_LIBRARY_PATH", "GCONV_PATH"):
        with pytest.raises(ValueError, match=f"env.{key}: not passed to a worker that runs as root"):
            env_for([GPU0], owner=root, extra={key: "/x"})


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="role"):
        env_for([GPU0], role="leader")
    with pytest.raises(ValueError, match="naming"):
        env_for([GPU0], naming="names")
    with pytest.raises(ValueError, match="replica"):
        env_for([GPU0], replica=-1)


def test_no_lang_means_none_set() -> None:
    owner = OwnerEnv(1, 1, "bin", "/bin", "/usr/bin", None)
    assert "LANG" not in env_for([GPU0], owner=owner)


def test_daemon_environment_is_neither_read_nor_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_OF_CGD", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    before = dict(os.environ)
    env = env_for([GPU0])
    assert "SECRET_OF_CGD" not in env and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert dict(os.environ) == before


def test_owner_env_from_the_password_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    root = owner_env(0, 0)
    assert (root.user, root.home, root.lang) == ("root", "/root", "de_DE.UTF-8")
    assert root.path == "/root/.local/bin:" + workerenv.SYSTEM_PATH
    monkeypatch.delenv("LANG")
    nobody = owner_env(65534, 65534)
    assert (nobody.uid, nobody.gid, nobody.user, nobody.lang) == (65534, 65534, "nobody", "C.UTF-8")
    with pytest.raises(ValueError, match="4000000"):
        owner_env(4000000, 4000000)
