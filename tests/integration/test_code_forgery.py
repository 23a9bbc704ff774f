"""Forged rewards in the `code` environment: each technique in FORGERIES scores 0 through a real
verifier over gRPC, in every sandbox mode this machine can run, while honest code scores 1.0 and
partial credit still counts. The verdict is computed in the verifier, so none of these can work
by construction; the corpus proves the construction holds."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from rollmesh_client import aio_channel

StartServer = Callable[..., Awaitable[MeshServer]]
LIMITS = SandboxLimits(wall_s=6.0, cpu_s=4, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)

# Tests whose answers a constant cannot satisfy; the honest solution passes them all.
ADD_TESTS = [
    "assert add(2, 3) == 5",
    "assert add(-7, 4) == -3",
    "assert add(10**12, 1) == 10**12 + 1",
    "assert abs(add(0.1, 0.2) - 0.3) < 1e-9",
    "assert all(add(x, x) == 2 * x for x in range(5))",
    "assert isinstance(add(1, 1), int) and not add(-3, 3) and add(1, 1) == 2",
]
HONEST = "def add(a, b):\n    return a + b\n"
IO_TESTS = {"inputs": ["3 4\n", "-2 5\n", "7 7\n"], "outputs": ["12\n", "-10\n", "49\n"]}
IO_HONEST = "a, b = map(int, input().split())\nprint(a * b)\n"

_FRAME = (
    "import json, struct\n"
    "def frame(ident, **body):\n"
    "    data = json.dumps({'id': ident, **body}).encode()\n"
    "    return struct.pack('>I', len(data)) + data\n"
)

FORGERIES: dict[str, str] = {
    # objects whose comparisons always succeed
    "eq_always_true": (
        "class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "    def __lt__(self, other): return True\n    def __bool__(self): return True\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    # an object of its own that lies in every method a test's builtin or operator could call
    "opaque_liar": (
        "class Liar:\n"
        "    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "    def __lt__(self, other): return True\n    def __sub__(self, other): return Liar()\n"
        "    def __abs__(self): return 0\n    def __bool__(self): return False\n"
        "    def __len__(self): return 0\n    def __index__(self): return 0\n"
        "    __hash__ = object.__hash__\n"
        "import builtins\nbuiltins.isinstance = lambda *a: True\n"
        "def add(a, b):\n    return Liar()\n"
    ),
    "int_subclass_eq": (
        "class Liar(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
        "    def __sub__(self, other): return Liar(0)\n    def __abs__(self): return 0\n"
        "def add(a, b):\n    return Liar(0)\n"
    ),
    # patching what the tests rely on
    "patch_builtins": (
        "import builtins, operator\n"
        "builtins.abs = lambda x: 0\nbuiltins.all = lambda it: True\nbuiltins.isinstance = lambda *a: True\n"
        "operator.eq = lambda a, b: True\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "abs = builtins.abs\nall = builtins.all\n"
        "def add(a, b):\n    return 0\n"
    ),
    # reaching the harness: its objects, its reply channel
    "hijack_runner_object": (
        "import gc\n"
        "for obj in gc.get_objects():\n"
        "    if type(obj).__name__ == 'Runner':\n"
        "        obj.handle = lambda req: {'value': True, 'passed': 6, 'total': 6}\n"
        "def add(a, b):\n    return 0\n"
    ),
    "forge_reply_frames": _FRAME
    + (
        "import os\n"
        "def add(a, b):\n"
        "    for fd in range(3, 64):\n"
        "        for ident in range(64):\n"
        "            try:\n"
        "                os.write(fd, frame(ident, value=True))\n"
        "            except OSError:\n"
        "                break\n"
        "    return 0\n"
    ),
    "forge_reply_after_answer": _FRAME
    + (
        "import os, gc\n"
        "fd = [o for o in gc.get_objects() if type(o).__name__ == 'Runner'][0].reply_fd\n"
        "def add(a, b):\n"
        "    os.write(fd, frame(999, value=a + b) + frame(1000, passed=6, total=6))\n"
        "    return 0\n"
    ),
    "monkeypatch_json_encoder": (
        "import json, sys\n"
        "real = json.dumps\n"
        "def forged(obj, *a, **k):\n"
        "    return real({'id': obj.get('id'), 'value': True} if isinstance(obj, dict) else obj, *a, **k)\n"
        "json.dumps = forged\n"
        "sys.modules['__main__'].encode = lambda value, depth=0: True\n"
        "def add(a, b):\n    return 0\n"
    ),
    # printing a verdict
    "print_fake_verdict": (
        "import json, os, sys\n"
        "line = json.dumps({'passed': 6, 'total': 6, 'cases': [{'ok': True}] * 6})\n"
        "for stream in (sys.stdout, sys.stderr):\n"
        "    print('0' * 32 + line, file=stream, flush=True)\n"
        "for fd in (1, 2):\n    os.write(fd, ('\\n' + 'f' * 32 + line + '\\n').encode())\n"
        "def add(a, b):\n    print('all tests passed')\n    return 0\n"
    ),
    # leaving early
    "sys_exit_0_at_load": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n",
    "os_exit_0_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "raise_special_exceptions": (
        "calls = [0]\n"
        "def add(a, b):\n"
        "    calls[0] += 1\n"
        "    raise [SystemExit(0), KeyboardInterrupt(), GeneratorExit(), StopIteration(5), "
        "BaseException('pass')][calls[0] % 5]\n"
    ),
    # the process itself
    "kill_the_parent": (
        "import os, posix, signal\n"
        "def add(a, b):\n"
        "    for pid in (os.getppid(), 1, -1):\n"
        "        try:\n            posix.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n            pass\n"
        "    return 0\n"
    ),
    "signal_tricks": (
        "import os, posix, signal\n"
        "for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):\n"
        "    signal.signal(sig, signal.SIG_IGN)\n"
        "def interrupt(signum, frame):\n    raise SystemExit(0)\n"
        "signal.signal(signal.SIGALRM, interrupt)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)  # lands inside the runner's own code\n"
        "def add(a, b):\n    posix.kill(os.getpid(), signal.SIGSTOP)\n    return 0\n"
    ),
    # looking for the expected values
    "read_expected_anywhere": (
        "import os, re, sys\n"
        "blobs = [' '.join(sys.argv).encode(), repr(dict(os.environ)).encode()]\n"
        "paths = ['/proc/self/cmdline', '/proc/self/environ', '/proc/1/cmdline', '/proc/1/environ']\n"
        "paths += [os.path.join(d, n) for d in ('.', '/sandbox', '/tmp') if os.path.isdir(d) "
        "for n in os.listdir(d)]\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n        paths += [f'/proc/{pid}/cmdline', f'/proc/{pid}/environ']\n"
        "for fd in range(0, 64):\n"
        "    try:\n        blobs.append(os.read(fd, 1 << 16))\n    except OSError:\n        pass\n"
        "for p in paths:\n"
        "    try:\n        blobs.append(open(p, 'rb').read(1 << 20))\n    except OSError:\n        pass\n"
        "nums = [int(n) for n in re.findall(rb'== *(-?\\d+)\\b', b'\\n'.join(blobs))]\n"
        "def add(a, b):\n    return nums.pop(0) if nums else 0\n"
    ),
    # sizes
    "oversized_value": "def add(a, b):\n    return list(range(3_000_000))\n",
    "oversized_output": "def add(a, b):\n    print('5' * 10_000_000)\n    return 0\n",
    "deep_value": "def add(a, b):\n    v = []\n    for _ in range(100_000):\n        v = [v]\n    return v\n",
}

HOST_ATTACKS = {"kill_the_parent"}
IO_FORGERIES: dict[str, str] = {
    "io_write_fd1_directly": "import os\nos.write(1, b'12\\n-10\\n49\\n')\n",
    "io_read_requests": "import os\nprint(os.read(0, 1 << 16).decode())\n",
    "io_exit_early": "import os\nos._exit(0)\n",
    "io_fake_verdict": "print('all tests passed')\nprint({'passed': 3, 'total': 3})\n",
    "io_patch_print": "import builtins\nbuiltins.print = lambda *a, **k: None\nprint(input())\n",
}


def _modes() -> list[str]:
    return ["namespaces", "process"]


@pytest.fixture(params=_modes())
async def verifier(
    request: pytest.FixtureRequest, start_server: StartServer
) -> AsyncIterator[tuple[Client, MeshServer, str]]:
    mode = str(request.param)
    sandbox = SandboxConfig(isolation=mode, concurrency=2, limits=LIMITS, allow_unsafe_process=True)
    if mode == "namespaces":
        ok, why = await Sandbox(sandbox).probe()
        if not ok:
            pytest.skip(f"namespaces are not available here: {why}")
    cfg = VerifierConfig(sandbox=sandbox)
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    client = await Client.connect(verifier=server.address, timeout_s=60)
    try:
        yield client, server, mode
    finally:
        await client.close()
        await svc.aclose()


async def _healthy(address: str) -> bool:
    async with aio_channel(address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def _reward(
    client: Client, tests: object, code: str, *, partial: bool = False
) -> tuple[float, dict[str, Any]]:
    task = {"verifier_metadata": {"tests": tests, "partial_credit": partial}}
    r = await client.verifier.verify("code", task, f"```python\n{code}```")
    return r.reward, json.loads(r.details_json)


async def test_forgery_corpus_scores_zero(verifier: tuple[Client, MeshServer, str]) -> None:
    client, server, mode = verifier
    assert len(FORGERIES) + len(IO_FORGERIES) >= 10
    honest, details = await _reward(client, ADD_TESTS, HONEST)
    assert honest == 1.0, details
    for name, code in FORGERIES.items():
        if name in HOST_ATTACKS and mode == "process":
            continue  # kill(-1) from `process` mode reaches every process of its uid on this shared box
        for partial in (False, True):
            reward, details = await _reward(client, ADD_TESTS, code, partial=partial)
            assert reward == 0.0, (name, partial, details)
        assert await _healthy(server.address), name
    for name, code in IO_FORGERIES.items():
        reward, details = await _reward(client, IO_TESTS, code, partial=True)
        assert reward == 0.0, (name, details)
    honest, details = await _reward(client, ADD_TESTS, HONEST)
    assert honest == 1.0, details
    io_honest, details = await _reward(client, IO_TESTS, IO_HONEST)
    assert io_honest == 1.0, details


async def test_partial_credit_still_counts(verifier: tuple[Client, MeshServer, str]) -> None:
    client, _, _ = verifier
    wrong_on_negatives = "def add(a, b):\n    return abs(a) + abs(b)\n"
    reward, details = await _reward(client, ADD_TESTS, wrong_on_negatives, partial=True)
    assert details["status"] == "ok" and details["total"] == len(ADD_TESTS), details
    assert reward == pytest.approx(4 / 6), details  # add(-7, 4) and add(-3, 3) are wrong
    assert [c["ok"] for c in details["cases"]] == [True, False, True, True, True, False]
    strict, _ = await _reward(client, ADD_TESTS, wrong_on_negatives)
    assert strict == 0.0
    io_partial, details = await _reward(
        client, IO_TESTS, "a, b = map(int, input().split())\nprint(abs(a * b))\n", partial=True
    )
    assert io_partial == pytest.approx(2 / 3), details


HUMANEVAL_TESTS = [
    "def check(candidate):\n"
    "    assert candidate(2, 3) == 5\n"
    "    for x in range(4):\n"
    "        assert candidate(x, -x) == 0\n"
    "    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9\n"
    "\n"
    "check(add)\n"
]


async def test_helper_style_tests_cannot_be_forged(verifier: tuple[Client, MeshServer, str]) -> None:
    """HumanEval's shape (`def check(candidate): assert ...`, then `check(add)`): the helper's
    asserts run in the verifier too, so the same forgeries score 0 and honest code 1.0."""
    client, _, _ = verifier
    honest, details = await _reward(client, HUMANEVAL_TESTS, HONEST)
    assert honest == 1.0, details
    for name in ("eq_always_true", "int_subclass_eq", "patch_builtins", "hijack_runner_object"):
        reward, details = await _reward(client, HUMANEVAL_TESTS, FORGERIES[name], partial=True)
        assert reward == 0.0, (name, details)


# Tests that get their cases or their verdict from helpers without asserts.
HELPER_DATA_TESTS = [
    "def cases():\n    return [(2, 3, 5), (-7, 4, -3), (10, 10, 20)]\n"
    "for a, b, want in cases():\n    assert add(a, b) == want\n",
    "def agrees(f, n):\n    total = 0\n    for i in range(n):\n        total += f(i, 1) - (i + 1)\n"
    "    return total == 0\n"
    "assert agrees(add, 5)\n",
]
# Rewrites the runner so that whatever a probe asks of a test helper comes back as a pass: an
# empty list of cases, True for a check.
HIJACK_HELPER_ANSWERS = (
    "import gc\n"
    "runner = [o for o in gc.get_objects() if type(o).__name__ == 'Runner'][0]\n"
    "real = runner.handle\n"
    "def handle(req, real=real):\n"
    "    src = req.get('src', '')\n"
    "    if req.get('op') == 'eval' and 'cases' in src:\n"
    "        return {'value': ['list', []]}\n"
    "    if req.get('op') == 'eval' and 'agrees' in src:\n"
    "        return {'value': True}\n"
    "    return real(req)\n"
    "runner.handle = handle\n"
    "def add(a, b):\n    return 0\n"
)


async def test_helpers_without_asserts_cannot_be_forged(verifier: tuple[Client, MeshServer, str]) -> None:
    """A helper the tests call for their cases or a verdict is interpreted in the verifier: a
    runner rewritten to answer 'no cases' or True for it scores 0; honest code still scores 1.0."""
    client, _, _ = verifier
    honest, details = await _reward(client, HELPER_DATA_TESTS, HONEST)
    assert honest == 1.0, details
    for code in (HIJACK_HELPER_ANSWERS, FORGERIES["hijack_runner_object"], FORGERIES["eq_always_true"]):
        reward, details = await _reward(client, HELPER_DATA_TESTS, code, partial=True)
        assert reward == 0.0, (code, details)


# Statements of the tests run in the sandbox; what they do there is seen here as in Python.
STATEMENT_TESTS = [
    "want = [3, 2, 1]\nx = [1, 2, 3]\nalias = x\nrev(x)\nassert x == want and alias == want",
    "def check(f):\n    y = {'a': [1, 2]}\n    f(y['a'])\n    assert y == {'a': [2, 1]}\ncheck(rev)",
    "x = 3\nx = add(x, 2)\nassert x == 5",
    "nums = [3, 1, 2]\nout = sort_copy(nums)\nassert out == sorted(nums)",
    "res = []\nres.append(add(1, 1))\nres.extend([add(2, 2)])\nres.sort(reverse=True)\nassert res == [4, 2]",
    "got = {}\nfor n in range(3):\n    got[n] = add(n, n)\nassert got == {0: 0, 1: 2, 2: 4}",
    "x = [1, 2, 3]\nassert rev(x) is None and x == [3, 2, 1]",
    # not carried back: the answer compared is the same call's (rewrite_input must stay 0)
    "nums = [3, 1, 2]\nassert sort_copy(nums) is not None and sort_copy(nums) == sorted(nums)",
]
STATEMENT_HONEST = (
    "def rev(a):\n    a.reverse()\n\ndef add(a, b):\n    return a + b\n\n"
    "def sort_copy(a):\n    return sorted(a)\n"
)
WRONG = "def add(a, b):\n    return 0\n\ndef sort_copy(a):\n    return a\n"
STATEMENT_FORGERIES = {
    "no_op": "def rev(a):\n    pass\n\n" + WRONG,
    # a global of the name a rebinding statement assigns: a probe of `x` found it (the statement's
    # own x was dropped), so `assert x == 5` passed for any add
    "shadow_rebound_name": "x = 5\ndef rev(a):\n    pass\n\n" + WRONG,
    # rewrites the input it returns: `sorted(nums)` must still be the test's nums
    "rewrite_input": (
        "def rev(a):\n    pass\n\ndef add(a, b):\n    return 0\n\n"
        "def sort_copy(a):\n    a[:] = [9]\n    return [9]\n"
    ),
    # claims a statement changed the expected value (never sent to the sandbox) or a rebound name
    "claim_changed_expected": (
        "import gc\n"
        "runner = [o for o in gc.get_objects() if type(o).__name__ == 'Runner'][0]\n"
        "real = runner.handle\n"
        "def handle(req, real=real):\n"
        "    if req.get('op') == 'exec' and 'rev(' in req.get('src', ''):\n"
        "        real(req)\n"
        "        y = ['dict', [['a', ['list', [1, 2]]]]]\n"
        "        return {'changed': {'want': ['list', [1, 2, 3]], 'y': y}}\n"
        "    return real(req)\n"
        "runner.handle = handle\n"
        "def rev(a):\n    pass\n\n" + WRONG
    ),
}


async def test_statements_see_what_the_solution_did(verifier: tuple[Client, MeshServer, str]) -> None:
    """A list of the tests' changed by its own methods (`res.append(add(1, 1))`) or an item
    assignment (`got[n] = add(n, n)`) changes here (it changed a copy in the sandbox); one they
    pass to the solution in a statement (`rev(x)`) and change there is changed here too (it stayed
    as it was: a correct in-place solution scored 0); a name a statement rebinds from the
    solution's answer (`x = add(x, 2)`) keeps that answer (it was lost: `x` then named nothing, or
    the solution's own global x). What the sandbox claims changed is only ever a value the
    statement was given. `assert rev(x) is None and x == ...` sees the change too (rev's answer is
    None: only its effect counts, as for the statement `rev(x)`)."""
    client, _, _ = verifier
    honest, details = await _reward(client, STATEMENT_TESTS, STATEMENT_HONEST)
    assert honest == 1.0, details
    for name, code in STATEMENT_FORGERIES.items():
        reward, details = await _reward(client, STATEMENT_TESTS, code, partial=True)
        assert reward == 0.0, (name, details)


async def _honest_one_forged_zero(
    client: Client, tests: list[str], honest: str, forged: dict[str, str]
) -> None:
    """`honest` scores 1.0 on `tests`; each of `forged` scores 0, in well under the run's limits."""
    reward, details = await _reward(client, tests, honest)
    assert reward == 1.0, details
    for name, code in forged.items():
        started = time.monotonic()
        reward, details = await _reward(client, tests, code, partial=True)
        assert reward == 0.0, (name, details)
        assert time.monotonic() - started < 30, name


# Methods that insert into the tests' own dicts and sets, and `xs.sort(key=f)` with the solution's f.
CONTAINER_TESTS = [
    "d = {'a': 1}\nd.update(pairs(2))\nd.update(b=sq(2))\nassert d == {'a': 1, 0: 0, 1: 1, 'b': 4}",
    "seen = set()\nfor n in range(4):\n    seen.add(sq(n))\nassert seen == {0, 1, 4, 9}",
    "d = {}\nd.setdefault('k', sq(3))\ns = {1}\ns.update([sq(2), sq(2)])\n"
    "assert d == {'k': 9} and s == {1, 4}",
    "xs = ['bb', 'a', 'ccc', 'dd']\nxs.sort(key=weight)\nassert xs == ['a', 'bb', 'dd', 'ccc']",
    "xs = [3, 1, 2]\nxs.sort(key=lambda v: weight('x' * v), reverse=True)\nassert xs == [3, 2, 1]",
]
CONTAINER_HONEST = (
    "def pairs(n):\n    return {i: i for i in range(n)}\n\ndef sq(n):\n    return n * n\n\n"
    "def weight(s):\n    return len(s)\n"
)
CONTAINER_WRONG = (
    "def pairs(n):\n    return {}\n\ndef sq(n):\n    return n + n\n\ndef weight(s):\n    return -len(s)\n"
)
CONTAINER_FORGERIES = {
    "wrong": CONTAINER_WRONG,
    # keys that share one hash (ints congruent mod 2**61 - 1; tuples whose hashes combine to one):
    # inserting n of them costs n**2 on the verifier's event loop; they are refused, not inserted
    "colliding_ints": (
        "M = (1 << 61) - 1\n"
        "def pairs(n):\n    return {k * M: 0 for k in range(1, 17)}\n"
        "def sq(n):\n    return (n + 1) * M\n"
        "def weight(s):\n    return 0\n"
    ),
    "tuples": "def pairs(n):\n    return {}\ndef sq(n):\n    return (n, n)\ndef weight(s):\n    return ()\n",
    "huge": (
        "def pairs(n):\n    return {}\ndef sq(n):\n    return 1 << 65536\n"
        "def weight(s):\n    return 1 << 65536\n"
    ),
    # an object whose comparisons lie, as a key or an element
    "liar": (
        "class Yes:\n    def __eq__(self, o): return True\n    def __hash__(self): return 0\n"
        "    def __lt__(self, o): return False\n"
        "def pairs(n):\n    return {Yes(): Yes()}\ndef sq(n):\n    return Yes()\n"
        "def weight(s):\n    return Yes()\n"
    ),
}


async def test_inserts_and_key_sorts_on_the_tests_values(verifier: tuple[Client, MeshServer, str]) -> None:
    """`d.update(...)`, `s.add(...)`, `d.setdefault(...)`, `s.update(...)` on a dict or set of the
    tests' and `xs.sort(key=f)` with the solution's f changed a copy in the sandbox: a correct
    solution scored 0. They run here now; a key that an answer could make share a hash (a large int,
    a tuple, a float) fails its case, so none costs quadratic time here."""
    await _honest_one_forged_zero(verifier[0], CONTAINER_TESTS, CONTAINER_HONEST, CONTAINER_FORGERIES)


# Answers of types the stdlib makes for exact arithmetic.
VALUE_TESTS = [
    "from fractions import Fraction\nassert ratio(1, 3) == Fraction(1, 3) and ratio(2, 4) == Fraction('1/2')",
    "from decimal import Decimal\nassert dsum('0.1', '0.2') == Decimal('0.3')",
    "from collections import deque\nassert window([1, 2, 3], 2) == deque([2, 3])",
    "import fractions\nassert ratio(3, 1) ** 2 == 9 and {ratio(1, 3)} == {fractions.Fraction(2, 6)}",
]
VALUE_HONEST = (
    "from fractions import Fraction\nfrom decimal import Decimal\nfrom collections import deque\n"
    "def ratio(a, b):\n    return Fraction(a, b)\n\ndef dsum(a, b):\n    return Decimal(a) + Decimal(b)\n\n"
    "def window(xs, n):\n    return deque(xs, maxlen=n)\n"
)
VALUE_FORGERIES = {
    "floats": (
        "def ratio(a, b):\n    return a / b\n\ndef dsum(a, b):\n    return float(a) + float(b)\n\n"
        "def window(xs, n):\n    return xs[-n:]\n"
    ),
    # subclasses whose comparisons lie: they come back as the plain values they hold
    "lying_subclasses": (
        "from fractions import Fraction\nfrom decimal import Decimal\nfrom collections import deque\n"
        "class F(Fraction):\n    def __eq__(self, o): return True\n    __hash__ = Fraction.__hash__\n"
        "class D(Decimal):\n    def __eq__(self, o): return True\n    __hash__ = Decimal.__hash__\n"
        "class Q(deque):\n    def __eq__(self, o): return True\n"
        "def ratio(a, b):\n    return F(7, 1)\n\ndef dsum(a, b):\n    return D(7)\n\n"
        "def window(xs, n):\n    return Q([7])\n"
    ),
    # values that would cost seconds to reduce or compare here: refused at decoding
    "huge": (
        "from fractions import Fraction\nfrom decimal import Decimal\nimport random\n"
        "def ratio(a, b):\n    bits = 1 << 20\n"
        "    return Fraction(random.getrandbits(bits), random.getrandbits(bits) | 1)\n\n"
        "def dsum(a, b):\n    return Decimal('1' * 4000 + 'e999999999')\n\n"
        "def window(xs, n):\n    return {Fraction(k * ((1 << 61) - 1) + 1) for k in range(1, 2000)}\n\n"
    ),
}


async def test_exact_number_types_come_back(verifier: tuple[Client, MeshServer, str]) -> None:
    """`assert f(1, 3) == Fraction(1, 3)`, a Decimal or deque answer: each failed as not plain
    data, so a correct solution scored 0. They come back as data now, built strictly here, and the
    test's own Fraction/Decimal/deque are built here; sizes that would cost seconds here fail."""
    await _honest_one_forged_zero(verifier[0], VALUE_TESTS, VALUE_HONEST, VALUE_FORGERIES)


# A class the solution defines, checked through what Python would ask of it: len(), str(),
# list(), isinstance(), its truth, `is None`; a comparison of it stays refused.
CLASS_TESTS = [
    "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and list(s) == [1, 2] and sorted(s) == [1, 2]",
    "s = Stack()\ns.push(1)\nassert str(s) == 'Stack[1]' and isinstance(s, Stack)",
    "s = Stack()\nassert s is not None and not s\ns.push(0)\nassert s and s.pop() == 0",
]
CLASS_HONEST = (
    "class Stack:\n"
    "    def __init__(self):\n        self.items = []\n"
    "    def push(self, x):\n        self.items.append(x)\n"
    "    def pop(self):\n        return self.items.pop()\n"
    "    def __len__(self):\n        return len(self.items)\n"
    "    def __iter__(self):\n        return iter(self.items)\n"
    "    def __str__(self):\n        return 'Stack' + str(self.items)\n"
)


async def test_objects_of_its_own_are_asked_what_python_would_ask(
    verifier: tuple[Client, MeshServer, str],
) -> None:
    """`len(s)`, `str(s)`, `isinstance(s, Stack)`, `assert s`, `s is not None` on an object the
    solution made: every such test failed ('a Stack is not plain data'), so a correct class scored
    0. Such a call is now asked of the sandbox as a whole; a comparison or an expected value still
    never goes there (opaque_liar in the corpus: its object lies in every method)."""
    client, _, _ = verifier
    honest, details = await _reward(client, CLASS_TESTS, CLASS_HONEST)
    assert honest == 1.0, details
    wrong, details = await _reward(
        client,
        CLASS_TESTS,
        CLASS_HONEST.replace("[1, 2]", "[2, 1]").replace("self.items.append(x)", "self.items.insert(0, x)"),
        partial=True,
    )
    assert wrong == pytest.approx(2 / 3), details  # list(s) and sorted(s) differ: only case 1 fails


# Inputs the tests draw from `random`, and values of theirs changed by calls that are not the solution's.
RANDOM_TESTS = [
    "import random\nfor _ in range(5):\n    a = [random.randint(0, 100) for _ in range(20)]\n"
    "    assert my_sort(a) == sorted(a)",
    "import random\nrandom.seed(1)\nxs = random.sample(range(1000), 50)\nassert my_sort(xs) == sorted(xs)",
    "from random import randint, shuffle\nys = list(range(30))\nshuffle(ys)\n"
    "assert my_sort(ys) == list(range(30))",
    "zs = [3, 1, 2]\nzs.reverse()\nassert my_sort(zs) == [1, 2, 3]",
]
RANDOM_FORGERIES = {
    # every random draw in the sandbox is 0 (or nothing), so the identity "sorts" every input
    "patch_random": (
        "import random\nrandom.randint = lambda a, b: 0\nrandom.sample = lambda *a, **k: []\n"
        "random.shuffle = lambda x: None\ndef my_sort(a):\n    return a\n"
    ),
    # claims a statement that is not the solution's call sorted the test's list
    "claim_changed_by_a_method": (
        "import gc\n"
        "runner = [o for o in gc.get_objects() if type(o).__name__ == 'Runner'][0]\n"
        "real = runner.handle\n"
        "def handle(req, real=real):\n"
        "    if req.get('op') == 'exec' and 'reverse' in req.get('src', ''):\n"
        "        return {'changed': {'zs': ['list', [1, 2, 3]]}}\n"
        "    return real(req)\n"
        "runner.handle = handle\n"
        "def my_sort(a):\n    return a\n"
    ),
}


async def test_random_inputs_are_drawn_in_the_verifier(verifier: tuple[Client, MeshServer, str]) -> None:
    """`random` runs in the verifier (a generator per run, seeded by the tests' random.seed): a
    solution that patched the sandbox's random.randint to 0 made a wrong sort pass randomized tests
    (2 of 3). What a call changed comes back only from the solution's own calls, never from a method
    of the test's value or a module's function run in the sandbox."""
    client, _, _ = verifier
    honest, details = await _reward(client, RANDOM_TESTS, "def my_sort(a):\n    return sorted(a)\n")
    assert honest == 1.0, details
    for name, code in RANDOM_FORGERIES.items():
        reward, details = await _reward(
            client, RANDOM_TESTS[:3] if name == "patch_random" else RANDOM_TESTS[3:], code, partial=True
        )
        assert reward == 0.0, (name, details)
