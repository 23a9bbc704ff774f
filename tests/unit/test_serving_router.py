"""SessionAffinityRouter's in-flight counts under the orders in which Ray Serve reports a request
(no Ray started: the router's callbacks are called directly)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rollmesh.serving.router import SessionAffinityRouter


def _router() -> SessionAffinityRouter:
    router = SessionAffinityRouter.__new__(SessionAffinityRouter)  # Serve's own state is not needed
    router.initialize_state()
    return router


def _replica(uid: str) -> Any:
    return SimpleNamespace(unique_id=uid)


def _request(request_id: str, **kwargs: Any) -> Any:
    return SimpleNamespace(kwargs=kwargs, metadata=SimpleNamespace(internal_request_id=request_id))


def test_a_request_is_counted_while_it_runs() -> None:
    router = _router()
    router.on_request_routed(_request("r1"), _replica("a"), None)
    router.on_request_routed(_request("r2", batch_size=3), _replica("a"), None)
    assert router._load("a") == 4
    router.on_request_completed(_replica("a"), "r1")
    router.on_request_completed(_replica("a"), "r2")
    assert router._load("a") == 0


def test_a_completion_reported_before_the_routing_leaves_no_load() -> None:
    """Serve registers the completion callback before it awaits the replica's acceptance: a short
    call (stats) can be reported completed first. Counting its routing then leaked one request on
    that replica for good, and new sessions all went to the other one."""
    router = _router()
    router.on_request_completed(_replica("a"), "r1")
    router.on_request_routed(_request("r1"), _replica("a"), None)
    assert router._load("a") == 0
    router.on_request_routed(_request("r2"), _replica("a"), None)  # later requests still count
    assert router._load("a") == 1


def test_a_rejected_attempt_does_not_release_the_retry_on_another_replica() -> None:
    router = _router()
    router.on_request_routed(_request("r1"), _replica("b"), None)  # retried on b after a rejected it
    router.on_request_completed(_replica("a"), "r1")  # a's rejected attempt, reported late
    assert router._load("b") == 1
    router.on_request_completed(_replica("b"), "r1")
    assert router._load("b") == 0
