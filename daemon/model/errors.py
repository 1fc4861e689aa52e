"""Typed refusals of the manager, each with the HTTP status it maps to.

The manager raises these and knows nothing of HTTP; the server turns them
into `{"error": {"code", "message"}}` answers without guessing.
"""

from __future__ import annotations


class ManagerError(Exception):
    status = 500
    code = "internal"


class BadRequest(ManagerError):
    status = 400
    code = "bad_request"


class Forbidden(ManagerError):
    status = 403
    code = "forbidden"


class NotFound(ManagerError):
    status = 404
    code = "not_found"


class Conflict(ManagerError):
    status = 409
    code = "conflict"


class StillRunning(ManagerError):
    """Processes of a worker outlived SIGKILL (stuck in the kernel, as in a hung driver call): the
    operation stopped short, and the devices stay held (never two owners) until they are gone."""

    status = 409
    code = "still_running"


class InsufficientCapacity(ManagerError):
    status = 409
    code = "insufficient_capacity"


class Unsatisfiable(ManagerError):
    status = 422
    code = "unsatisfiable"


class LimitReached(ManagerError):
    """A per-user limit of the configuration: one user may not exhaust cgd for the others."""

    status = 429
    code = "limit_reached"


class StateUnwritable(ManagerError):
    """The state could not be written (read-only, permission, I/O error): the change did not happen."""

    status = 503
    code = "state_unwritable"


class InsufficientStorage(StateUnwritable):
    """No space left on the state's filesystem: the change did not happen; it can be retried once there is."""

    status = 507
    code = "insufficient_storage"


class Unavailable(ManagerError):
    status = 503
    code = "unavailable"


class Stopping(Unavailable):
    """cgd is stopping (or restarting) and cut this request short: ask again once it is back.

    A long poll in flight when cgd stops gets this rather than waiting for the
    loop to be torn down under it; clients take it as they take a refused
    connection, and wait for the next cgd."""

    code = "stopping"
