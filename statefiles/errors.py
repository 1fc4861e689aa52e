"""Typed refusals of the state files.

The daemon turns these into one line for the user (or a 503 for a locked
state), so each message says which file is involved and what to do about it.
"""

from __future__ import annotations


class StateError(Exception):
    """Anything that keeps the state from being read or written."""


class StateFormatError(StateError, ValueError):
    """A document does not have the shape of a state file; the message names the JSON path."""


class StateCorruptError(StateError):
    """Neither the state file nor its backup can be used: refusing beats starting empty."""


class StateVersionError(StateError):
    """The state was written by a newer computegroups than this one."""


class StateLockedError(StateError):
    """Another process (or thread) held the state lock for longer than the timeout."""
