"""`rollmesh run`'s progress line (commands/_progress.py): it fits the terminal and never cuts a count."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rollmesh.commands._progress import BAR_MAX
from rollmesh.commands._progress import JobProgressLine


def screen(line: JobProgressLine, width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(line)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return text.rstrip("\n").split("\n")


def a_job(**fields: object) -> JobProgressLine:
    line = JobProgressLine(
        "job-aa16f6ec80d5", done=1234, total=1600, rollouts_per_second=401.37, mean_reward=0.6075, failed=7
    )
    for name, value in fields.items():
        setattr(line, name, value)
    line.started, line.ended = 1000.0, 4725.0  # a fixed clock: 1:02:05
    return line


@pytest.mark.parametrize("width", [80, 120])
def test_one_line_that_fits_with_every_count_whole(width: int) -> None:
    [shown] = screen(a_job(), width)
    assert len(shown) <= width
    for part in ("1234/1600", "reward 0.608", "failed 7", "1:02:05"):
        assert part in shown
    assert "401.4 rollouts/s" in shown and "━" in shown and "…" not in shown


def test_the_job_id_goes_first_then_the_bar_then_the_long_rate() -> None:
    wide, at_80 = screen(a_job(), 120)[0], screen(a_job(), 80)[0]
    assert wide.startswith("job-aa16f6ec80d5 ") and wide.count("━") == BAR_MAX
    assert "job-aa16f6ec80d5" not in at_80 and at_80.startswith("━")
    [at_60] = screen(a_job(total=65536, done=65535), 60)
    assert at_60.startswith("━") and "65535/65536 401/s" in at_60
    [at_55] = screen(a_job(total=65536, done=65535, failed=123456), 55)
    assert at_55 == "65535/65536 401/s reward 0.608 failed 123456 1:02:05"


def test_narrower_than_the_counts_folds_instead_of_cutting() -> None:
    lines = screen(a_job(total=65536, done=65535, stale=3), 20)
    assert len(lines) > 1 and all(len(line) <= 20 for line in lines)
    assert " ".join(lines).split() == "65535/65536 401/s reward 0.608 failed 7 stale 3 1:02:05".split()


def test_unknown_total_and_what_the_job_waits_on() -> None:
    line = a_job(total=None, done=0, waiting="gateway unreachable for 12 s")
    first, second = screen(line, 80)
    assert "0/?" in first and second == "waiting: gateway unreachable for 12 s"


def test_groups_replaced_and_short_are_shown_when_there_are_any() -> None:
    [plain] = screen(a_job(), 120)
    assert "replaced" not in plain and "short" not in plain
    [shown] = screen(a_job(replaced=5, short=1), 120)
    assert "failed 7 replaced 5 short 1" in shown


def test_the_metrics_table_names_groups_replaced_and_short() -> None:
    from rollmesh.commands._jobs import metrics_rows
    from rollmesh_client.v1 import scheduler_pb2 as pb

    plain = dict(metrics_rows(pb.JobMetrics(num_rollouts=8), pb.Job()))
    assert "failed groups replaced" not in plain
    job = pb.Job(progress=pb.JobProgress(groups_replaced=11, groups_short=2))
    rows = dict(metrics_rows(pb.JobMetrics(num_rollouts=8), job))
    assert rows["failed groups replaced"] == "11" and rows["  not replaced (REPLACEMENTS_EXHAUSTED)"] == "2"
