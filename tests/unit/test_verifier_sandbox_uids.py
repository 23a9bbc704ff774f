"""Sandbox uids are leased host-wide: two verifiers (two pools, or two processes) that start at the
same place in the block never hand out one uid at the same time; a lease ends with its run or its
process; a run never waits for a uid."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import textwrap
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rollmesh.mesh.uids import SANDBOX_UIDS
from rollmesh.mesh.uids import UidPool


@pytest.fixture(autouse=True)
def same_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pool starts at the block's first uid: the worst case for independent verifiers."""
    monkeypatch.setattr(random, "randrange", lambda n: 0)


def leased_pool(directory: Path) -> UidPool:
    pool = UidPool()
    pool.use_leases(directory)
    return pool


async def test_two_verifiers_never_hand_out_one_uid_at_once(tmp_path: Path) -> None:
    a, b = leased_pool(tmp_path), leased_pool(tmp_path)
    for _ in range(3):  # uids go back and come out again
        held_a = await asyncio.gather(*(a.lease() for _ in range(8)))
        held_b = await asyncio.gather(*(b.lease() for _ in range(8)))
        for uid in held_a[:4]:
            a.release(uid)
        held_b += await asyncio.gather(*(b.lease() for _ in range(4)))
        in_use = [*held_a[4:], *held_b]
        assert len(set(in_use)) == len(in_use), (held_a, held_b)
        for uid in in_use:
            (a if uid in held_a else b).release(uid)
    assert (tmp_path / f"{SANDBOX_UIDS[0]}.lock").exists()


HOLDER = textwrap.dedent(
    """
    import asyncio, random, sys
    from pathlib import Path
    random.randrange = lambda n: 0
    from rollmesh.mesh.uids import UidPool
    async def main():
        pool = UidPool()
        pool.use_leases(Path(sys.argv[1]))
        print(*[await pool.lease() for _ in range(3)], flush=True)
        sys.stdin.read()
    asyncio.run(main())
    """
)


async def test_another_process_holds_its_uids_until_it_dies(tmp_path: Path) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None
        async with asyncio.timeout(60):
            theirs = {int(uid) for uid in (await holder.stdout.readline()).split()}
        assert theirs == set(SANDBOX_UIDS[:3])
        pool = leased_pool(tmp_path)
        ours = [await pool.lease() for _ in range(3)]
        assert not theirs & set(ours), ours
    finally:
        holder.kill()
        await holder.wait()
    # flock's lease died with its process: a verifier starting there gets that uid now
    assert await leased_pool(tmp_path).lease() == SANDBOX_UIDS[0]


async def test_when_every_uid_is_leased_a_run_shares_one_at_once(tmp_path: Path) -> None:
    other = leased_pool(tmp_path)
    for _ in SANDBOX_UIDS:
        await other.lease()
    pool = leased_pool(tmp_path)
    async with asyncio.timeout(5):
        shared = [await pool.lease() for _ in range(3)]
    assert shared == list(SANDBOX_UIDS[:3])  # the longest free of its own, as when its pool ran out
    for uid in shared:
        pool.release(uid)
    # one verifier with more runs than uids: they share, the fewest runs per uid first
    alone = UidPool()
    uids = [await alone.lease() for _ in range(len(SANDBOX_UIDS) + 2)]
    assert len(set(uids)) == len(SANDBOX_UIDS) and uids[-2:] == uids[:2]


async def test_a_lease_never_waits_so_a_cancelled_run_holds_no_uid(tmp_path: Path) -> None:
    pool = leased_pool(tmp_path)
    cancelled = asyncio.ensure_future(pool.lease())
    cancelled.cancel()  # before it ran: it took nothing
    ran = asyncio.ensure_future(pool.lease())
    await asyncio.sleep(0)  # one step of the loop: the lease is taken whole, never half
    ran.cancel()  # too late to cancel: the run holds its uid and gives it back
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert ran.done() and not ran.cancelled() and ran.result() == SANDBOX_UIDS[0]
    assert dict(pool._runs) == {SANDBOX_UIDS[0]: 1}
    assert await leased_pool(tmp_path).lease() == SANDBOX_UIDS[1]  # leased host-wide meanwhile
    pool.release(ran.result())
    assert not pool._runs and pool._free[-1] == SANDBOX_UIDS[0]
    assert await leased_pool(tmp_path).lease() == SANDBOX_UIDS[0]


@pytest.mark.parametrize("why", ["a file in the way", "writable by others"])
async def test_without_a_lease_directory_uids_are_unique_in_the_verifier_and_one_line_says_so(
    tmp_path: Path, why: str
) -> None:
    directory = tmp_path / "uids"
    if why == "a file in the way":
        directory.write_text("")
    else:
        directory.mkdir(mode=0o777)
        directory.chmod(0o777)
    with capture_logs() as logs:
        pool = leased_pool(directory)
    assert [line["event"] for line in logs] == ["sandbox_uid_leases_unavailable"]
    assert "unique within this verifier only" in logs[0]["effect"]
    held = await asyncio.gather(*(pool.lease() for _ in range(8)))
    assert held == list(SANDBOX_UIDS[:8])


async def test_a_uid_another_verifier_held_is_not_the_next_one_taken(tmp_path: Path) -> None:
    """When another verifier lets a uid go, its run's processes may still be dying: a uid seen held
    elsewhere goes to the tail of the free ones, as if just used."""
    a, b = leased_pool(tmp_path), leased_pool(tmp_path)
    theirs = await a.lease()
    ours = await b.lease()
    a.release(theirs)
    assert await b.lease() not in (theirs, ours)
    assert b._free[-1] == theirs
