"""`rollmesh reverify -e math` (the built-in `math` environment, not NeMo Gym's server) of NeMo Gym
0.7.0's math_with_judge `example_rollouts.jsonl` reproduces every reward NeMo Gym recorded,
through a real verifier over gRPC (issue 38).

Its second row is the one that needs care: the reference `(2+\\sqrt{3})^{2016}` form and the answer
`(1+\\sqrt{3})^{4033}` form are one number of ~10^1152, too large for math-verify to evaluate and
slow for its simplify: the environment decides it exactly (grading.decide_large) and scores it 1,
as NeMo Gym's math-verify did. The first and last rows are wrong answers NeMo Gym scored 0 (the
first after its LLM judge also said no; here no judge is asked: the symbolic check alone decides).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import StartServer
from tests.conftest import nemo_gym_assets


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_reverify_with_the_math_environment_reproduces_nemo_gyms_rewards(
    start_server: StartServer, tmp_path: Path
) -> None:
    data = Path(nemo_gym_assets.data("0.7.0")) / "resources_servers" / "math_with_judge" / "data"
    recorded = rows(data / "example_rollouts.jsonl")
    assert len(recorded) == 5 and {r["reward"] for r in recorded} == {0.0, 1.0}
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    # A generous check timeout: a loaded 2-core host must not turn a slow check into a verdict.
    svc = VerifierService.from_catalog(
        VerifierConfig(math_timeout_s=120.0), Catalog.from_config(roots), entry_points=False
    )
    await svc.start()
    try:
        server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
        out = tmp_path / "rescored.jsonl"
        args = ["reverify", str(data / "example_rollouts.jsonl"), "-e", "math"]
        args += ["--verifier", server.address, "-o", str(out)]
        res = await asyncio.to_thread(CliRunner().invoke, build_app(), args)
    finally:
        await svc.aclose()
    assert res.exit_code == 0, res.output
    assert "reverified 5 rows (0 errors, 0 rewards changed)" in res.stderr, res.stderr
    rescored = rows(out)
    assert [r["reward"] for r in rescored] == [r["reward"] for r in recorded]
    for row in rescored:
        assert row["reward"] == row["previous_reward"], row["verify_details"]
    large = rescored[1]["verify_details"]
    assert large["reason"].startswith("equivalent (too large for math-verify, decided exactly"), large
