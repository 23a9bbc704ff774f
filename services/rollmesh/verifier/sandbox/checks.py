"""The verifier's part in a test's verdict: it relays, and it decides what may cross. Nothing here
runs a test or untrusted code.

A run of assert tests has two sandboxed processes (verifier/sandbox/core.py): the solution's, which
loads the code and answers calls into it (`_sandbox_runner.Runner`), and the clean interpreter,
which never loads it and runs the tests, whole, as Python (`_clean_runner.CleanRunner`). The
verdict of a case is what the clean interpreter reports: the solution's process never holds a
test, an expected value or a comparison, and nothing the verdict depends on is computed there
except the answers of the solution's own functions and objects.

`Relay` carries a case's calls from the clean interpreter to the solution's process and the
answers back. Every answer (and every argument of a function of the tests' that the solution
calls back) is decoded strictly here (`values.decode_value`: exact builtin types, bounded
size and depth, an object of the solution's own as a bare reference) and encoded again, so the
clean interpreter only ever receives plain data this process wrote. A case that makes more than
`MAX_CALLS` calls, nests callbacks deeper than `MAX_NESTING`, or gets an answer that does not
decode is ended and fails, whatever the test catches.
"""

from __future__ import annotations

import ast
import functools
import keyword
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from typing import Protocol

from rollmesh.verifier.errors import BadValue
from rollmesh.verifier.errors import ChannelBroken
from rollmesh.verifier.sandbox._sandbox_runner import MAX_ERROR_CHARS
from rollmesh.verifier.sandbox._sandbox_runner import encode
from rollmesh.verifier.sandbox.values import Ref
from rollmesh.verifier.sandbox.values import Shaped
from rollmesh.verifier.sandbox.values import decode_value

MAX_CALLS = 100_000  # calls into the solution per case
MAX_NESTING = 32  # callbacks within calls within callbacks ...
MAX_NAMES = 4096
NAME_KINDS = frozenset({"module", "own"})


class Side(Protocol):
    """One sandboxed process, as the relay sees it (`sandbox.Channel`)."""

    async def send(self, op: str, **fields: Any) -> int: ...

    async def receive(self, ident: int) -> dict[str, Any]: ...


CACHED_SOURCE_CHARS = 65_536  # test cases up to this size are parsed once while they recur (a group's)


def unverifiable_case(source: str) -> str | None:
    """Why a test case can never give a verdict whatever the solution does (it does not parse),
    else None: a task whose tests fail this is a bad task, not a 0."""
    return _names_in(source)[1] if len(source) <= CACHED_SOURCE_CHARS else _parsed(source)[1]


def _parsed(source: str) -> tuple[frozenset[str], str | None]:
    """The names a test case's source mentions, and why it does not compile (None when it does).
    Whatever the source is, the answer is one of these: a case nested too deeply for the parser or
    the compiler (RecursionError, MemoryError), holding a NUL or a lone surrogate (ValueError) is
    a task no answer can pass, never an error of the verifier's."""
    try:
        tree = ast.parse(source, "test", "exec")
        compile(tree, "test", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return frozenset(), f"the test does not parse: {exc}"
    except (RecursionError, MemoryError):
        return frozenset(), "the test does not parse: it is nested too deeply"
    except ValueError as exc:  # NUL bytes, a lone surrogate (UnicodeEncodeError)
        return frozenset(), f"the test does not parse: {str(exc)[:200]}"
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)), None


_names_in = functools.lru_cache(maxsize=256)(_parsed)


def normalize_output(text: str) -> list[str]:
    """stdout as compared: surrounding whitespace and each line's trailing whitespace ignored."""
    return [line.rstrip() for line in text.strip().splitlines()]


def plain_names(names: Any) -> list[list[Any]]:
    """The solution's globals as its process listed them (`Runner.names`), checked: identifiers,
    a known kind ("module" with a short module name, or "own"). A name starting with `__` is
    dropped."""
    if type(names) is not list or len(names) > MAX_NAMES:
        raise ChannelBroken("malformed list of names")
    out: list[list[Any]] = []
    for item in names:
        if type(item) is not list or len(item) != 3:
            raise ChannelBroken("malformed name")
        name, kind, detail = item
        if type(name) is str and name.startswith("__"):
            continue  # dunders and the clean interpreter's own hooks are never the solution's
        if type(name) is not str or not name.isidentifier() or keyword.iskeyword(name) or len(name) > 200:
            raise ChannelBroken("malformed name")
        if kind not in NAME_KINDS:
            raise ChannelBroken("malformed name")
        if kind == "module" and not _short_str(detail):
            raise ChannelBroken("malformed module name")
        out.append([name, kind, detail if kind != "own" else None])
    return out


def names_used(cases: Collection[Any]) -> set[str]:
    """Every name the tests' source mentions: only those of the solution's globals are bound in the
    clean interpreter (a claim about any other name changes nothing there, and nothing is imported
    for it)."""
    used: set[str] = set()
    for case in map(str, cases):
        used.update((_names_in if len(case) <= CACHED_SOURCE_CHARS else _parsed)(case)[0])
    return used


def _short_str(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= 200


def replain(value: Any) -> Any:
    """A value the solution's process sent, decoded strictly and written again by this process.
    Raises BadValue, and only that, for anything else it could send."""
    decoded = decode_value(value, refs=True)
    try:
        return encode(decoded, 0, _ref)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadValue(f"not plain data: {str(exc)[:200]}") from None


def _ref(value: Any) -> list[Any]:
    """What `decode_value` gives that `encode` does not write itself: a reference, a `Shaped`."""
    if type(value) is Ref:
        return ["ref", value.index]
    if type(value) is Shaped:
        if value.tag == "namedtuple":
            typename, fields = value.head
            return ["namedtuple", [typename, list(fields), [encode(v, 0, _ref) for v in value.body]]]
        factory = value.head if type(value.head) is not tuple else list(value.head)
        return [
            "defaultdict",
            [_ref(factory) if type(factory) is Ref else factory, encode(value.body, 0, _ref)[1]],
        ]
    raise TypeError(f"a {type(value).__name__} is not plain data")


def _raised(name: Any, error: Any) -> dict[str, Any]:
    ok = type(name) is str and name.isidentifier() and len(name) <= 60
    return {"raised": name if ok else "Exception", "error": str(error)[:MAX_ERROR_CHARS]}


@dataclass
class Relay:
    """Carries one run's cases between the clean interpreter and the solution's process."""

    clean: Side
    solution: Side
    calls: int = 0
    aborted: str = ""
    ended: bool = False  # the clean interpreter's child ended after its last case, as "exit" would
    _setup: int | None = None  # the request whose reply is still to be read

    async def setup(self, names: Any, used: Collection[str]) -> None:
        """Bind the solution's globals that the tests mention (`names_used`) in the clean interpreter;
        its reply is read before the first case's (`settle`), sent on the same turn."""
        bound = [item for item in plain_names(names) if item[0] in used]
        self._setup = await self.clean.send("setup", names=bound)

    async def settle(self) -> None:
        """Read the reply to `setup` if no case has."""
        if self._setup is None:
            return
        reply = await self.clean.receive(self._setup)
        self._setup = None
        if "error" in reply:
            raise ChannelBroken(f"the clean interpreter refused the names: {reply['error']}")

    async def case(self, src: str, *, last: bool = False) -> dict[str, Any]:
        """The clean interpreter's verdict on one case: ok, asserts, calls, error, unverifiable.
        `last`: its child ends once it has answered (it says so to its parent first, as on "exit")."""
        self.calls, self.aborted = 0, ""
        ident = await self.clean.send("case", src=src, **({"last": True} if last else {}))
        await self.settle()
        frame = await self._serve(ident, 0)
        self.ended = last
        verdict = frame.get("verdict")
        if (
            type(verdict) is not dict
            or type(verdict.get("ok")) is not bool
            or type(verdict.get("error")) is not str
            or type(verdict.get("unverifiable")) is not str
        ):
            raise ChannelBroken(f"the clean interpreter answered a case with {str(frame)[:200]}")
        if self.aborted:
            return {**verdict, "ok": False, "error": f"not checked: {self.aborted}"}
        return verdict

    async def _serve(self, ident: int, depth: int) -> dict[str, Any]:
        """The clean interpreter's answer to request `ident`, relaying the calls it makes first."""
        while True:
            frame = await self.clean.receive(ident)
            if "call" not in frame:
                return frame
            ident = await self.clean.send("answer", **await self._call(frame["call"], depth))

    async def _call(self, call: Any, depth: int) -> dict[str, Any]:
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.aborted = self.aborted or f"more than {MAX_CALLS} calls into the solution in one case"
        elif depth > MAX_NESTING:
            self.aborted = self.aborted or f"callbacks nested deeper than {MAX_NESTING}"
        if self.aborted:
            return {"abort": self.aborted}
        if type(call) is not dict:
            raise ChannelBroken("malformed call from the clean interpreter")
        ident = await self.solution.send(
            "call", fn=call.get("fn"), args=call.get("args", []), kwargs=call.get("kwargs", {})
        )
        while True:
            frame = await self.solution.receive(ident)
            if "callback" not in frame:
                return self._answer(frame, call)
            returned = await self._callback(frame["callback"], depth)
            ident = await self.solution.send("returned", **returned)

    async def _callback(self, callback: Any, depth: int) -> dict[str, Any]:
        """The solution called a function of the tests': the clean interpreter calls it with the
        arguments, decoded strictly here, and its answer goes back to the solution as it is."""
        try:
            if type(callback) is not dict or type(callback.get("fn")) is not int:
                raise BadValue("malformed callback")
            args, kwargs = callback.get("args"), callback.get("kwargs")
            if type(args) is not list or type(kwargs) is not dict:
                raise BadValue("malformed callback")
            fields = {
                "fn": callback["fn"],
                "args": [replain(a) for a in args],
                "kwargs": {str(k): replain(v) for k, v in kwargs.items()},
            }
        except BadValue as exc:
            return _raised("BadValue", exc)
        frame = await self._serve(await self.clean.send("callback", **fields), depth + 1)
        if "value" in frame:
            return {"value": frame["value"]}
        return _raised(frame.get("raised", "Exception"), frame.get("error", ""))

    def _answer(self, frame: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        """The solution's answer to a call, as the clean interpreter may receive it."""
        if "raised" in frame:
            return _raised(frame["raised"], frame.get("error", ""))
        if "error" in frame:  # its runner failed to read the call: the solution's doing
            return _raised("Exception", frame["error"])
        if "value" not in frame:
            raise ChannelBroken("a reply to call without a value")
        try:
            answer: dict[str, Any] = {"value": replain(frame["value"])}
            changed = frame.get("changed", [])
            if type(changed) is not list:
                raise BadValue("malformed changes")
            answer["changed"] = [self._changed(item, call) for item in changed]
        except BadValue as exc:
            self.aborted = f"an answer of the solution's does not decode: {exc}"[:MAX_ERROR_CHARS]
            return {"abort": self.aborted}
        return answer

    @staticmethod
    def _changed(item: Any, call: dict[str, Any]) -> list[Any]:
        """One argument the call changed in place: a position or keyword the call was given."""
        if type(item) is not list or len(item) != 2:
            raise BadValue("malformed change")
        key, value = item
        given: Collection[Any] = (
            range(len(call.get("args", []))) if type(key) is int else call.get("kwargs", {})
        )
        if type(key) not in (int, str) or key not in given:
            raise BadValue("a change to an argument the call was not given")
        return [key, replain(value)]


__all__ = ["Ref", "Relay", "names_used", "normalize_output", "plain_names", "unverifiable_case"]
