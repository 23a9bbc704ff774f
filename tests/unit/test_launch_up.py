"""`rollmesh up`'s process handling without the services: the child-output reader takes lines of any
length, and (below) the supervisor's restart policy, backoff, give-up and stop, driven by tiny
Python children so each case runs in about a second."""

from __future__ import annotations

import asyncio
import sys
import textwrap

from rollmesh.launch.processes import pump_lines

FLOOD = textwrap.dedent(
    """
    import sys
    out = sys.stdout
    out.write("x" * 1_000_000 + "\\n")
    for i in range(50_000):
        out.write(f"flood {i}\\n")
    out.write("end")
    """
)


async def test_pump_takes_a_megabyte_line_and_a_flood() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOD, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    lines: list[str] = []
    await asyncio.wait_for(pump_lines("[svc] ", proc.stdout, lines.append, 4096), 120)
    assert await proc.wait() == 0
    assert lines[0] == "[svc] " + "x" * 4096 + "...[truncated 995904 bytes]"
    assert lines[1] == "[svc] flood 0" and lines[-2] == "[svc] flood 49999"
    assert lines[-1] == "[svc] end" and len(lines) == 50_002
