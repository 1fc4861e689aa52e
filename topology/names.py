"""How GPU models are named, and how a model glob (`--model`, `model =`) matches a name.

NVML names a GPU `NVIDIA H100 80GB HBM3` or `Tesla V100-SXM2-16GB`; people
say, and cgctl shows, `H100 80GB`. A glob matches the whole name, or the name
without its leading vendor words, so `H100*` finds the H100 as `*H100*` and
`NVIDIA H100*` do; otherwise a glob as people write it finds nothing and the
refusal does not say why. The vendor words are one regex in syntax both
Python's `re` and RE2 (DRA's CEL `matches`) read, so cgd and the Kubernetes
selectors (daemon/kubernetes/render_selectors.py) match the same names.
"""

from __future__ import annotations

import re
from fnmatch import translate

VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")
VENDOR_PREFIX = r"(?:(?:" + "|".join(VENDOR_WORDS) + r")[\s-]+)*"
"""Any number of leading vendor words (`NVIDIA GeForce `), over the lower-cased name."""


def model_matches(name: str, glob: str) -> bool:
    """Whether `glob` (case-blind, fnmatch's rules) matches the GPU name `name`, its vendor words
    optional: `H100*`, `*h100*` and `NVIDIA H100*` all match `NVIDIA H100 80GB HBM3`."""
    return re.fullmatch(VENDOR_PREFIX + translate(glob.lower()), name.lower()) is not None
