"""Model globs as people write them: the vendor words of NVML's name are optional."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st

from computegroups.topology.names import model_matches

NAMES = ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090",
         "NVIDIA L40S")


@pytest.mark.parametrize("glob, name", [
    ("H100*", "NVIDIA H100 80GB HBM3"), ("h100*", "NVIDIA H100 80GB HBM3"), ("*H100*", "NVIDIA H100 80GB HBM3"),
    ("NVIDIA H100*", "NVIDIA H100 80GB HBM3"), ("V100*", "Tesla V100-SXM2-16GB"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090"), ("GeForce*", "NVIDIA GeForce RTX 4090"), ("L40S", "NVIDIA L40S"),
])
def test_a_glob_may_leave_out_the_vendor_words(glob: str, name: str) -> None:
    assert model_matches(name, glob)


@pytest.mark.parametrize("glob, name", [
    ("H100", "NVIDIA H100 80GB HBM3"), ("A100*", "NVIDIA H100 80GB HBM3"), ("100*", "NVIDIA H100 80GB HBM3"),
    ("L40", "NVIDIA L40S"), ("80GB*", "NVIDIA A100-SXM4-80GB"),
])
def test_what_is_left_must_still_match_whole(glob: str, name: str) -> None:
    assert not model_matches(name, glob)


@given(glob=st.text(alphabet="aHh1 0-*?[]!", max_size=8), name=st.sampled_from(NAMES))
def test_every_name_the_plain_glob_matches_still_matches(glob: str, name: str) -> None:
    if fnmatchcase(name.lower(), glob.lower()):
        assert model_matches(name, glob)
