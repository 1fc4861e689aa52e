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


class Unavailable(ManagerError):
    status = 503
    code = "unavailable"
