"""Index ranges such as `0-55,112-167`, the way Linux and nvidia-smi write CPU sets.

Machine files use them to name GPUs and CPUs compactly and the CLI prints CPU
affinity with them, so parsing and formatting live side by side and stay
each other's inverse.
"""

from __future__ import annotations

from collections.abc import Iterable


def parse_ranges(text: str) -> tuple[int, ...]:
    """Sorted, distinct indices; raises ValueError with the offending piece."""
    out: set[int] = set()
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            raise ValueError(f"empty item in range list {text!r}")
        lo_text, sep, hi_text = piece.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"{piece!r} is not an index or a range like 0-3") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{piece!r} is not an ascending range of non-negative indices")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def format_ranges(indices: Iterable[int]) -> str:
    """`0-3,8,10-11`; the empty set gives an empty string."""
    ordered = sorted(set(indices))
    pieces: list[str] = []
    start = prev = None
    for i in ordered:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            pieces.append(_piece(start, prev))
        start = prev = i
    if start is not None:
        pieces.append(_piece(start, prev))
    return ",".join(pieces)


def _piece(start: int, end: int | None) -> str:
    return str(start) if end == start else f"{start}-{end}"
