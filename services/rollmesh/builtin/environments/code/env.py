"""`code`: the response's Python code runs against the task's unit tests in a sandbox."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rollmesh.builtin.environments.code.unit_tests import unit_tests_spec
from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.errors import CheckFailed
from rollmesh.verifier.errors import CheckTimeout
from rollmesh.verifier.errors import SandboxUnavailable
from rollmesh.verifier.sandbox.checks import unverifiable_case
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.sandbox.core import TestSpec

# Possessive: a run of blanks after ``` is read once (backtracking between the two blank runs took
# seconds on a long run of spaces, on the verifier's event loop).
_FENCE = re.compile(r"```[ \t]*+(python3?|py)?+[ \t]*+\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last ```python fenced block (else the last fenced block, else the whole text)."""
    blocks = _FENCE.findall(text)
    tagged = [body for lang, body in blocks if lang]
    if tagged:
        return str(tagged[-1])
    if blocks:
        return str(blocks[-1][1])
    return text


def test_spec(meta: Mapping[str, Any]) -> TestSpec | str:
    """The task's tests, or why they are unusable (missing, malformed, a case that does not parse
    or whose asserts would have to run in the sandbox). Accepts a list of assert statements, a
    list of {"input", "output"} pairs, or {"inputs": [...], "outputs": [...]}; or, with no `tests`,
    NeMo Gym's `unit_tests` (unit_tests.py)."""
    try:
        if "tests" not in meta and "unit_tests" in meta:
            spec = unit_tests_spec(meta["unit_tests"])
            where = "verifier_metadata.unit_tests case {}"
        else:
            spec = _tests_spec(meta)
            where = "verifier_metadata.tests[{}]"
    except RecursionError:  # str() of a value nested past the interpreter's recursion limit
        return "verifier_metadata: a test is nested too deeply"
    if isinstance(spec, TestSpec) and spec.kind == "asserts":
        for i, case in enumerate(spec.cases):
            if why := unverifiable_case(case):
                return f"{where.format(i)}: {why}"
    return spec


def _tests_spec(meta: Mapping[str, Any]) -> TestSpec | str:
    if "tests" not in meta:
        return (
            "verifier_metadata has no tests (`tests`, or NeMo Gym's `unit_tests`); rows of NeMo Gym's "
            "example_rollouts.jsonl carry none: reverify them with --tasks data/example.jsonl"
        )
    tests = meta["tests"]
    if isinstance(tests, Mapping) and isinstance(tests.get("inputs"), list):
        ins, outs = tests["inputs"], tests.get("outputs")
        if not isinstance(outs, list) or len(ins) != len(outs):
            return "verifier_metadata.tests.inputs and .outputs must be lists of equal length"
        return TestSpec("io", [{"input": str(i), "output": str(o)} for i, o in zip(ins, outs, strict=True)])
    if isinstance(tests, list) and tests:
        if all(isinstance(t, str) for t in tests):
            return TestSpec("asserts", list(tests))
        if all(isinstance(t, Mapping) and "input" in t and "output" in t for t in tests):
            return TestSpec("io", [{"input": str(t["input"]), "output": str(t["output"])} for t in tests])
    return "verifier_metadata.tests must be assert strings, input/output pairs, or {inputs, outputs}"


class CodeEnv(Environment):
    """Python programming tasks. The code (a ```python block, or the whole answer) runs against
    `verifier_metadata.tests` in a sandbox (namespaces, chroot, a uid per run, CPU/wall/memory/
    process/file/output limits, no network, empty environment); the verdict is computed here.
    Reward 1.0 when every test passes (or the pass rate with `verifier_metadata.partial_credit`).
    A sandbox that never came up (the code did not run) raises CheckFailed, or CheckTimeout when it
    did not start within the wall-clock limit: retryable errors, never a reward of 0. Tests no
    answer could pass (see `test_spec`) raise BadTask."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.sandbox = Sandbox(context.config.sandbox)

    async def start(self) -> None:
        """Refuses (ConfigError naming what is missing) when no OS-level isolation is available,
        unless the operator opted in to the unsafe process mode."""
        await self.sandbox.start()

    async def aclose(self) -> None:
        await self.sandbox.aclose()  # its pre-started clean interpreters

    def sandbox_mode(self) -> str:
        return self.sandbox.label

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        del session
        spec = test_spec(task.metadata)
        if isinstance(spec, str):  # no answer could pass: an error (BAD_TASK), never a reward of 0
            raise BadTask(spec)
        text = response.final_text
        code = extract_code(text)
        if not code.strip():
            return VerifyResult(0.0, {"pass_rate": 0.0}, "", {"reason": "empty response"})
        try:
            run = await self.sandbox.run(code, spec)
        except SandboxUnavailable as exc:  # never ran, or starved of CPU: no verdict, not a 0
            raise (CheckTimeout if exc.timed_out else CheckFailed)(str(exc)) from None
        if run.unverifiable:  # a case no answer could pass or fail: an error (BAD_TASK), never a 0
            raise BadTask(f"verifier_metadata.tests: unverifiable test, {run.unverifiable}")
        total = run.total or len(spec.cases)
        rate = run.passed / total if total else 0.0
        all_passed = run.status == "ok" and total > 0 and run.passed == total
        partial = bool(task.metadata.get("partial_credit", False))
        reward = rate if partial and run.status == "ok" else (1.0 if all_passed else 0.0)
        if run.status != "ok":
            reason = run.error or run.status
        elif all_passed:
            reason = "all tests passed"
        else:
            reason = run.error or f"{run.passed}/{total} tests passed"
        details = {"reason": reason, **run.summary(1000)}
        return VerifyResult(
            reward,
            {"pass_rate": rate if run.status == "ok" else 0.0, "all_passed": 1.0 if all_passed else 0.0},
            code[:2000],
            details,
        )
