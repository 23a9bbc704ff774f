"""A sink that holds writes (a trainer mid training step, or hung) shows in the job's progress:
`waiting_on` says so, which `rollmesh run`'s bar and `rollmesh jobs status` print."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


class _StalledSink(MemorySink):
    """Holds every write until `go` is set, and says so, as a trainer sink with a full window does."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def write(self, rollout: Any) -> None:
        await self.go.wait()
        await super().write(rollout)

    def waiting(self) -> str:
        return "" if self.go.is_set() else "trainer sink at T acknowledged nothing for 9 s"


async def test_a_stalled_sink_shows_in_the_jobs_progress(tmp_path: Path) -> None:
    path = Rows.arithmetic(4).write(tmp_path / "d.jsonl")
    sink = _StalledSink()
    mgr = JobManager(
        CATALOG,
        model=LocalModel(),
        env=LocalEnv(),
        output_dir=str(tmp_path),
        sink_factory=lambda job_id, plan, directory: sink,
    )
    try:
        rec = await mgr.submit(JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(tmp_path)))
        assert rec.run is not None
        assert (
            rec.run.progress_now(finished=False).waiting_on
            == "trainer sink at T acknowledged nothing for 9 s"
        )
        sink.go.set()
        done = await mgr.wait(rec.job_id)
        assert done.state == "SUCCEEDED", done.message
        assert rec.run.progress_now(finished=True).waiting_on == ""
    finally:
        await mgr.aclose()
