"""VerifyResult.not_finite (mesh/verify_result.py): what in a verdict is not a finite number, named,
or None; both the scheduler and the verifier refuse such a verdict."""

from __future__ import annotations

import math

from rollmesh.mesh.verify_result import VerifyResult


def test_not_finite_names_the_first_value_that_is_no_finite_number() -> None:
    assert VerifyResult(1.0).not_finite() is None
    assert VerifyResult(0.5, {"a": 1.0, "b": -0.0}).not_finite() is None
    assert VerifyResult(1, {"a": 0}).not_finite() is None  # ints and bools are real numbers
    assert VerifyResult(True, {"a": False}).not_finite() is None
    assert VerifyResult(math.nan).not_finite() == "reward = nan"
    assert VerifyResult(1.0, {"ok": 1.0, "x": math.inf}).not_finite() == "components['x'] = inf"
    assert VerifyResult(-math.inf, {"x": math.nan}).not_finite() == "reward = -inf"
    assert VerifyResult(1.0, {"x": "1"}).not_finite() == "components['x'] = '1'"  # type: ignore[dict-item]
    assert VerifyResult("a" * 200).not_finite() == f"reward = {('a' * 200)!r:.80}"  # type: ignore[arg-type]
    assert VerifyResult(1.0, {"x": None}).not_finite() == "components['x'] = None"  # type: ignore[dict-item]
