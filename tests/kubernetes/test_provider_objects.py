"""The pure half of the Kubernetes provider: cluster objects <-> docs/api.md documents."""

from __future__ import annotations

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")

from computegroups.daemon.kubernetes import cluster_objects as k

MIG_SLICE = {"spec": {"driver": "gpu.nvidia.com", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [
    {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-aaa"},
                                     "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
     "capacity": {"memory": {"value": "80Gi"}}},
    {"name": "gpu-1-mig-1g10gb-19-0", "attributes": {
        "type": {"string": "mig"}, "uuid": {"string": "MIG-bbb"}, "parentUUID": {"string": "GPU-aaa"},
        "profile": {"string": "1g.10gb"}, "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
     "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "14"}}},
]}}
OTHER_DRIVER = {"spec": {"driver": "example.com", "nodeName": "n1", "pool": {"name": "n1"},
                         "devices": [{"name": "gpu-0"}]}}


def test_devices_are_read_as_nvidias_driver_publishes_them() -> None:
    devices = k.slice_devices([MIG_SLICE, OTHER_DRIVER])
    assert sorted(devices) == [("n1", "gpu-1"), ("n1", "gpu-1-mig-1g10gb-19-0")]
    gpu, mig = devices[("n1", "gpu-1")], devices[("n1", "gpu-1-mig-1g10gb-19-0")]
    assert (gpu["index"], gpu["uuid"], gpu["mig_uuid"], gpu["memory_mib"]) == (1, "GPU-aaa", None, 81920)
    assert (mig["index"], mig["uuid"], mig["mig_uuid"], mig["mig_profile"], mig["memory_mib"]) == (
        1, "GPU-aaa", "MIG-bbb", "1g.10gb", 10240)
    (node,) = k.machines([{"metadata": {"name": "n1"}}, {"metadata": {"name": "cpu-only"}}], devices)
    assert node["id"] == "n1" and [g["index"] for g in node["machine"]["gpus"]] == [1]
    assert node["machine"]["mig"][0]["profile"] == "1g.10gb"


def test_claims_the_provider_refuses_or_warns_about() -> None:
    assert k.check_claim({"gpus": 2, "colocate": "pcie"}) == []
    (warning,) = k.check_claim({"gpus": 2, "colocate": "nvlink"})
    assert warning.startswith("colocate nvlink: NVIDIA's DRA driver publishes no nvlink attribute")
    with pytest.raises(ValueError, match=r"^exclusive: not supported by the Kubernetes provider"):
        k.check_claim({"gpus": 2, "exclusive": "nvlink"})


def test_the_schedulers_reason_comes_from_the_condition_then_the_events() -> None:
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/3 nodes are available"}]}}
    events = [{"type": "Warning", "reason": "FailedScheduling", "message": "older"},
              {"type": "Warning", "reason": "FailedScheduling", "message": "newer"}]
    assert k.pod_reason(pod, events) == "0/3 nodes are available"
    assert k.pod_reason({"status": {}}, events) == "newer"
    assert k.pod_reason(None, []) is None
    claim = {"metadata": {"name": "g", "labels": {}, "annotations": {k.CLAIM: '{"gpus": 1}'}}}
    group = k.group_document(claim, {}, drained=False, reason=None)
    assert (group["state"], group["explanation"], group["claim"]) == ("pending", "waiting for the scheduler",
                                                                       {"gpus": 1})
