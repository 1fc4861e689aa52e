"""Counted nouns for messages: "1 GPU", "2 GPUs", said the same way everywhere."""

from __future__ import annotations


def plural(count: int, noun: str) -> str:
    """`count noun`, the noun in the plural unless the count is one (`plural(0, "GPU")` is "0 GPUs")."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
