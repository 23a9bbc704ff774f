"""Errors of the CLI's own work (`rollmesh reverify`), reported in one line like a service's."""

from rollmesh.mesh.errors import DeadlineExceeded, Unavailable


class VerifierUnavailable(Unavailable):
    reason = "VERIFIER_UNAVAILABLE"


class ReverifyTimeout(DeadlineExceeded):
    reason = "REVERIFY_TIMEOUT"
