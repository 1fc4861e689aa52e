"""The request rules applied before the search: share policies, `share`, selectors, `same`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from computegroups.daemon.model.claims import AllocatorConfig, Claim, SameAttribute, ShareMode, Strategy
from computegroups.daemon.model.config import parse_config
from computegroups.daemon.model.sharepolicy import CapacityRule
from computegroups.daemon.placement import choices
from computegroups.daemon.placement.allocator import Allocator, NeverFits
from computegroups.daemon.placement.records import DoesNotFitNow
from computegroups.topology import load_machine


def allocator(name: str = "synthetic-72", sharing: dict | None = None) -> Allocator:
    config = parse_config({"sharing": sharing}).allocator if sharing else AllocatorConfig()
    return Allocator(load_machine(name), config)


@given(low=st.integers(1, 100), step=st.integers(1, 50), count=st.integers(0, 20), want=st.integers(1, 2000))
def test_rounding_gives_the_smallest_valid_amount_at_or_above(low: int, step: int, count: int, want: int) -> None:
    rule = CapacityRule(memory=True, low=low, high=low + count * step, step=step)
    valid = [low + k * step for k in range(count + 1)]
    got = rule.round_up(want)
    assert got == next((v for v in valid if v >= want), None)
    values = CapacityRule(memory=False, values=tuple(valid))
    assert values.round_up(want) == got


def test_a_share_is_rounded_and_the_rounding_explained() -> None:
    a = allocator("dgx-h100", {"memory": {"valid_range": {"min": "2GiB", "step": "2GiB"}}})
    (p,) = choices.place(a, Claim(memory_mib=3000), ["g"], "ada")
    assert p.devices[0].memory_mib == 4096 and "memory 3000MiB rounded up to 4GiB" in p.score.explanation


def test_unshareable_gpus_get_no_share_but_whole_claims() -> None:
    a = allocator("dgx-h100", {"gpus": {str(i): {"shareable": False} for i in range(7)}})
    (p,) = choices.place(a, Claim(memory_mib=1024), ["s"], "ada")
    assert p.devices[0].gpu == 7
    (w,) = choices.place(a, Claim(gpus=1), ["w"], "ada")
    assert w.devices[0].gpu != 7
    none = allocator("dgx-h100", {"shareable": False})
    with pytest.raises(NeverFits, match="GPUs 0,1,2,3,4,5,6,7 are not shareable"):
        choices.place(none, Claim(memory_mib=1024), ["x"], "ada")


def test_share_any_falls_back_to_a_whole_gpu_with_enough_memory() -> None:
    a = allocator("dgx-h100", {"memory": {"valid_values": ["10GiB", "20GiB"]}})
    (p,) = choices.place(a, Claim(memory_mib=30 * 1024, share=ShareMode.ANY), ["g"], "ada")
    assert p.devices[0].whole and "a whole GPU (share = any)" in p.score.explanation
    with pytest.raises(NeverFits, match="outside the sharing policy"):
        choices.place(a, Claim(memory_mib=30 * 1024), ["h"], "ada")


def test_selectors_and_same_model_keep_to_matching_gpus() -> None:
    a = allocator()
    machine = a.machine
    (p,) = choices.place(a, Claim(gpus=2, model="*L40S*"), ["l"], "ada")
    assert {machine.gpu(d.gpu).name for d in p.devices} == {"NVIDIA L40S"}
    (q,) = choices.place(a, Claim(memory_mib=1024, compute_capability="8.0", min_memory_mib=80 * 1024), ["q"], "ada")
    assert machine.gpu(q.devices[0].gpu).name == "NVIDIA A100-SXM4-80GB", "the H100s have 79.6 GiB"
    placed = choices.place(a, Claim(gpus=1, same=SameAttribute.MODEL, model="*A100*"), ["r0", "r1", "r2"], "ada")
    assert len({machine.gpu(p.devices[0].gpu).name for p in placed}) == 1


def test_a_pool_and_per_gpu_policies_narrow_together() -> None:
    config = parse_config({"pools": {"late": [6, 7]},
                           "sharing": {"gpus": {"7": {"memory": {"valid_values": ["8GiB"]}}}}}).allocator
    a = Allocator(load_machine("dgx-h100"), config)
    (p,) = choices.place(a, Claim(memory_mib=1024, pool="late", gpu_ids=(7,)), ["g"], "ada")
    assert (p.devices[0].gpu, p.devices[0].memory_mib) == (7, 8192)
    (q,) = choices.place(a, Claim(memory_mib=1024, pool="late", strategy=Strategy.SPREAD), ["h"], "ada")
    assert (q.devices[0].gpu, q.devices[0].memory_mib) == (6, 1024), "GPU 6 keeps the default policy"


def test_same_model_refused_by_every_model_names_what_each_has() -> None:
    a = allocator("two-islands-16")
    names = sorted({g.name for g in a.machine.gpus})
    assert len(names) == 2, "one model per island"
    with pytest.raises(NeverFits) as never:
        choices.place(a, Claim(gpus=3, same=SameAttribute.MODEL), ["r0", "r1", "r2"], "ada")
    assert str(never.value).startswith("same model: no one model can ever hold it (")
    for name in names:
        assert f"{name}: 8 GPUs, 8 free" in str(never.value), str(never.value)
    for name, busy in zip(names, (7, 4), strict=True):
        gpus = tuple(g.index for g in a.machine.gpus if g.name == name)
        choices.place(a, Claim(gpus=busy, gpu_ids=gpus), [f"busy-{busy}"], "ada")
    with pytest.raises(DoesNotFitNow) as now:
        choices.place(a, Claim(gpus=5, same=SameAttribute.MODEL), ["r0"], "ada")
    assert str(now.value) == (f"same model: no one model has room for it now ({names[0]}: 8 GPUs, 1 free; "
                              f"{names[1]}: 8 GPUs, 4 free)")


def test_a_refusal_about_several_gpus_takes_the_plural_verb() -> None:
    with pytest.raises(NeverFits, match=r"needs 9 GPUs; the GPUs with model '\*H100\*' have 8 GPUs for whole"):
        choices.place(allocator("two-islands-16"), Claim(gpus=9, model="*H100*"), ["g"], "ada")
    with pytest.raises(NeverFits, match=r"needs 1 GPU; pool 'one' has 0 GPUs for whole claims"):
        choices.place(Allocator(load_machine("dgx-a100-mig"), parse_config({"pools": {"one": [7]}}).allocator),
                      Claim(gpus=1, pool="one"), ["g"], "ada")


def test_a_model_glob_may_leave_out_the_vendor_as_cgctl_shows_models() -> None:
    (p,) = choices.place(allocator("two-islands-16"), Claim(gpus=2, model="H100*"), ["g"], "ada")
    assert {d.gpu for d in p.devices} <= set(range(8, 16))
    with pytest.raises(NeverFits, match=r"no GPU of this machine has model 'H100' \(it has NVIDIA A100-SXM4-80GB"):
        choices.place(allocator("two-islands-16"), Claim(gpus=1, model="H100"), ["g"], "ada")


@pytest.mark.parametrize("glob, hint", [
    ("H100 80GB", "; did you mean '*H100 80GB*'?"), ("A100 80GB", "; did you mean '*A100*80GB*'?"),
    ("h100", "; did you mean '*h100*'?"), ("B200", ""), ("*B200*", "")])
def test_a_model_no_gpu_has_is_refused_with_a_glob_that_would_match(glob: str, hint: str) -> None:
    with pytest.raises(NeverFits) as refused:
        choices.place(allocator("two-islands-16"), Claim(gpus=1, model=glob), ["g"], "ada")
    assert str(refused.value).endswith("NVIDIA H100 80GB HBM3 (79GiB, 9.0))" + hint)
