"""serving/join.py: token discovery, the auth switch, address parsing and the one-line join errors
(Ray's own exceptions and messages, no cluster)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rollmesh.serving.errors import RayAuthFailed
from rollmesh.serving.errors import RayNotANode
from rollmesh.serving.errors import RayUnreachable
from rollmesh.serving.errors import RayVersionMismatch
from rollmesh.serving.join import connect_error
from rollmesh.serving.join import driver_on_node
from rollmesh.serving.join import enable_token_auth
from rollmesh.serving.join import host_port
from rollmesh.serving.join import token_source
from rollmesh.serving.join import wait_reachable


def test_token_found_where_ray_documents_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert token_source({"HOME": str(home)}) == ""
    assert token_source({"HOME": str(home), "RAY_AUTH_TOKEN": "abc"}) == "RAY_AUTH_TOKEN"
    token = tmp_path / "tok"
    assert token_source({"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(token)}) == ""  # missing file
    token.write_text("abc")
    assert token_source({"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(token)}).endswith(str(token))
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("abc")
    assert token_source({"HOME": str(home)}) == str(home / ".ray" / "auth_token")


def test_token_mode_is_turned_on_only_when_a_token_exists_and_the_mode_is_unset(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert enable_token_auth(env) == "" and "RAY_AUTH_MODE" not in env
    env["RAY_AUTH_TOKEN"] = "abc"
    assert enable_token_auth(env) == "RAY_AUTH_TOKEN" and env["RAY_AUTH_MODE"] == "token"
    explicit = {"HOME": str(tmp_path), "RAY_AUTH_TOKEN": "abc", "RAY_AUTH_MODE": "disabled"}
    assert enable_token_auth(explicit) == "" and explicit["RAY_AUTH_MODE"] == "disabled"


def test_addresses() -> None:
    assert host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert host_port("ray://head:10001") == ("head", 10001)
    assert host_port("auto") is None and host_port("") is None
    assert driver_on_node("head:6379") and not driver_on_node("ray://head:10001")
    assert not driver_on_node("auto")


def test_unreachable_address_fails_fast_in_one_line() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RayUnreachable) as info:
        wait_reachable(f"127.0.0.1:{port}", timeout_s=1.0)
    assert f"127.0.0.1:{port}" in info.value.message and "\n" not in info.value.message
    wait_reachable("auto", timeout_s=0.1)  # nothing to check: Ray finds the local node


def test_auth_failure_as_ray_raises_it() -> None:
    from ray.exceptions import AuthenticationError

    try:
        try:
            raise AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing")
        except AuthenticationError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from inner
    except ConnectionError as exc:
        error = connect_error("10.0.0.1:6379", exc)
    assert isinstance(error, RayAuthFailed) and error.reason == "RAY_AUTH_FAILED"
    assert "10.0.0.1:6379" in error.message and "RAY_AUTH_TOKEN_PATH" in error.message


def test_version_mismatch_with_rays_own_message() -> None:
    from ray._private.utils import check_version_info

    with pytest.raises(RuntimeError) as raised:
        check_version_info({"ray_version": "2.9.0", "python_version": "3.10.1"}, "node 10.0.0.2")
    error = connect_error("head:6379", raised.value)
    assert isinstance(error, RayVersionMismatch)
    assert "cluster Ray 2.9.0 / Python 3.10.1" in error.message and "\n" not in error.message


def test_not_a_node_and_anything_else() -> None:
    missing = RuntimeError(
        "No node info found matching attributes: '10.0.0.9' when trying to resolve node to connect to."
    )
    assert isinstance(connect_error("head:6379", ConnectionError("x").with_traceback(None)), RayUnreachable)
    try:
        raise ConnectionError("Failed to connect to Ray cluster at head:6379") from missing
    except ConnectionError as exc:
        error = connect_error("head:6379", exc)
    assert isinstance(error, RayNotANode) and "ray start --address=head:6379" in error.message
