"""A job's live progress line, laid out for the terminal's width at every refresh: the counts are
never cut. What gives way on a narrow terminal, in this order: the job id (printed on its own line
when the job was submitted), the bar, "rollouts/s" spelled out; below ~40 columns the line folds
rather than cuts. What the job waits on, when anything, is a second line.

    job-aa16f6ec80d5 ━━━━━━━━━━━━━━━━━━━━━━━━ 1600/1600 401.4 rollouts/s reward 0.608 failed 0 0:00:12
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field

from rich.console import Console
from rich.console import ConsoleOptions
from rich.console import RenderResult
from rich.text import Text

BAR_MIN, BAR_MAX = 10, 40


@dataclass
class JobProgressLine:
    """What the line shows; `update` it from each poll, render it with rich (e.g. in a `Live`)."""

    job_id: str
    done: int = 0
    total: int | None = None  # unknown until the first answer
    rollouts_per_second: float = 0.0
    mean_reward: float = 0.0
    failed: int = 0
    stale: int = 0
    replaced: int = 0  # failed groups replaced (JobSpec.replace_groups)
    short: int = 0  # failed groups that could not be replaced
    waiting: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  # set when the job ended: the clock stops

    def elapsed(self) -> str:
        seconds = int((self.ended or time.monotonic()) - self.started)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def parts(self, width: int) -> tuple[list[str], int]:
        """The text parts around the bar (the bar at index 0 or 1 when shown) and the bar's width
        (0: no bar), the richest layout that fits `width` columns."""
        counts = f"{self.done}/{'?' if self.total is None else self.total}"
        failed = (
            f"failed {self.failed}"
            + (f" stale {self.stale}" if self.stale else "")
            + (f" replaced {self.replaced}" if self.replaced else "")
            + (f" short {self.short}" if self.short else "")
        )
        reward, clock = f"reward {self.mean_reward:.3f}", self.elapsed()
        rate, short_rate = f"{self.rollouts_per_second:.1f} rollouts/s", f"{self.rollouts_per_second:.0f}/s"
        layouts = [
            [self.job_id, "", counts, rate, reward, failed, clock],
            ["", counts, rate, reward, failed, clock],
            ["", counts, short_rate, reward, failed, clock],
            [counts, short_rate, reward, failed, clock],
        ]
        for layout in layouts:
            # One space between parts; the bar takes what is left, within its bounds.
            room = width - sum(len(p) for p in layout) - (len(layout) - 1)
            if "" not in layout:
                if room >= 0:
                    return layout, 0
            elif room >= BAR_MIN:
                return layout, min(room, BAR_MAX)
        return layouts[-1], 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        parts, bar_width = self.parts(options.max_width)
        line = Text(overflow="fold", no_wrap=False)
        for i, part in enumerate(parts):
            if i:
                line.append(" ")
            if part:
                line.append(part, style="bold" if part == self.job_id else "")
                continue
            filled = bar_width * self.done // self.total if self.total else 0
            line.append("━" * filled, style="bar.finished" if self.ended else "bar.complete")
            line.append("━" * (bar_width - filled), style="bar.back")
        yield line
        if self.waiting:
            yield Text(f"waiting: {self.waiting}", style="yellow", overflow="fold")
