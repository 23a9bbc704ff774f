"""The server-side bearer check: which `authorization` values let a call run."""

from __future__ import annotations

import pytest

from rollmesh_client._auth import authorized

METHOD = "/rollmesh.v1.Scheduler/GetJob"


@pytest.mark.parametrize("value", ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", " Bearer  s3cret "])
def test_the_key_is_accepted_whatever_the_case_of_the_scheme(value: str) -> None:
    assert authorized(METHOD, [("authorization", value)], "s3cret")


@pytest.mark.parametrize(
    "value", ["Bearer s3cre", "Bearer s3cretx", "Basic s3cret", "s3cret", "Bearer", "", "Bearer S3CRET"]
)
def test_a_wrong_key_or_scheme_is_refused(value: str) -> None:
    assert not authorized(METHOD, [("authorization", value)], "s3cret")


def test_no_header_is_refused_and_no_key_lets_everything_run() -> None:
    assert not authorized(METHOD, [("x-other", "Bearer s3cret")], "s3cret")
    assert not authorized(METHOD, None, "s3cret")
    assert authorized(METHOD, None, "")


def test_health_and_reflection_answer_without_the_key() -> None:
    assert authorized("/grpc.health.v1.Health/Check", None, "s3cret")
    assert authorized("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None, "s3cret")
