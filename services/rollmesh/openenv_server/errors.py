"""The OpenEnv server's errors, each with its status code and ErrorInfo reason; `wire.error_code`
maps them to OpenEnv's WebSocket error codes."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class BadAction(mesh.InvalidArgument):
    """A step's action is not what the action schema says (`/schema`): the message names the field."""

    reason = "OPENENV_BAD_ACTION"
    http_status_override = 422  # what OpenEnv's server answers for an action its schema refuses


class BadReset(mesh.InvalidArgument):
    """A reset's parameters name no row of the dataset, or a parameter the server does not take."""

    reason = "OPENENV_BAD_RESET"
    http_status_override = 422


class NoEpisode(mesh.FailedPrecondition):
    """A step with no episode to act on: before any reset, after the episode ended, or over HTTP
    (each HTTP call is a fresh environment, as in OpenEnv's own server)."""

    reason = "OPENENV_NO_EPISODE"


class CannotServe(mesh.FailedPrecondition):
    """The environment cannot be an OpenEnv environment as it is (it scores groups of rollouts
    together), or the server has no rows to reset to."""

    reason = "OPENENV_CANNOT_SERVE"
