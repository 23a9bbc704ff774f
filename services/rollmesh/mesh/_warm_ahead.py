"""What a warm interpreter (mesh/_warm.py) makes ahead for its rollouts besides imports.

Standard library only (it runs in the program's own interpreter). Each rollout is a fresh process,
so what an installed library builds at its first use, from the machine alone, it builds again in
every rollout: the openai SDK's TLS context (its CA bundle parsed: ~18 ms of a rollout's ~45 ms),
pydantic's validators for the models a call completes, the platform facts it sends as headers (a
`uname -p` subprocess). `Ahead` makes those once, in the interpreter, never running the program's
own code, and so that a rollout's program observes what it would have built itself:

- **Spare TLS contexts.** The factories below, when loaded, are wrapped (every module's reference
  to them): the interpreter builds one context per factory with the arguments its library passes
  (`ssl.create_default_context()`, with certifi's bundle when certifi is loaded; httpcore2's
  `default_ssl_context()`), and a rollout's first call with those arguments gets its copy of that
  context (its own: the process is a fork) instead of a new one, when nothing it depends on differs
  there: the `SSL_CERT_FILE`, `SSL_CERT_DIR` and `SSLKEYLOGFILE` variables, and each CA file and
  folder it read (the same file by device, inode, size and time, readable by the rollout's uid: a
  spare never holds what the program could not have read). Every other call builds afresh, and
  every call does when `SSLKEYLOGFILE` is set (a spare would hold the log file as the interpreter
  opened it: all rollouts' keys in one file, none where the program's own would be).
- **Platform facts.** `platform.uname()` (with its `processor`, a subprocess), `platform.platform()`
  and `platform.freedesktop_os_release()`: the standard library caches them per process, and a
  rollout reads the same machine, the same files.
- **Pydantic models completed.** A model whose annotations name a type defined after it is built at
  its first use (`model_rebuild`); each rollout reports (`report`) which of the interpreter's
  incomplete models it completed, by their index in the interpreter's own list, and the
  interpreter completes those (from their module's namespace, as `model_rebuild()` does) for the
  rollouts after. Nothing else of a report is acted on.
"""

from __future__ import annotations

import functools
import gc
import inspect
import os
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

# (module, function, the keyword arguments its library calls it with: one spare each)
_TLS_FACTORIES: tuple[tuple[str, str], ...] = (
    ("ssl", "create_default_context"),
    ("httpcore2._ssl", "default_ssl_context"),
)
_TLS_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")
MAX_MODELS = 1 << 16


class Ahead:
    """Made in the interpreter (`prepare` after its imports and after each round of learned ones);
    a rollout's process inherits it (a fork) and calls `report` at its end."""

    def __init__(self) -> None:
        self.spares: dict[str, _Spare] = {}
        self.models: list[Any] = []  # append-only: a report names one by its index
        # Each model's own namespace, where pydantic marks it complete: what a rollout's report
        # reads (a class object each on its own pages, which a read's reference count would copy).
        self.namespaces: list[dict[str, Any]] = []
        self.complete: list[bool] = []  # as the interpreter has it (a rollout reports the others)
        self._known: set[int] = set()
        self._tried: set[int] = set()

    @property
    def learned(self) -> int:
        """How many models the reports have named (each is tried once, `take`): a round of lines
        that named none new leaves nothing to prepare."""
        return len(self._tried)

    def prepare(self) -> None:
        self._platform()
        self._tls()
        self._incomplete_models()

    # -- platform facts ------------------------------------------------------------------------

    @staticmethod
    def _platform() -> None:
        platform = sys.modules.get("platform")
        if platform is None:
            return
        try:
            platform.uname().processor  # noqa: B018 - a cached property: computed here, kept
            platform.platform()
            platform.freedesktop_os_release()
        except Exception:  # (no os-release file: the cache stays empty, the rollout finds none)
            pass

    # -- TLS contexts --------------------------------------------------------------------------

    def _tls(self) -> None:
        for module_name, name in _TLS_FACTORIES:
            module = sys.modules.get(module_name)
            original = getattr(module, name, None) if module is not None else None
            if original is None:
                continue
            key = f"{module_name}.{name}"
            spare = self.spares.get(key)
            if spare is None:
                if getattr(original, "__wrapped_by_rollmesh__", False):
                    continue
                spare = self.spares[key] = _Spare(original)
                _replace_everywhere(original, spare.wrapper)
            spare.fill(_tls_calls(module_name))

    # -- pydantic ------------------------------------------------------------------------------

    def _incomplete_models(self) -> None:
        pydantic = sys.modules.get("pydantic")
        base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
        if base is None:
            return
        for n, cls in enumerate(self.models):
            self.complete[n] = bool(cls.__dict__.get("__pydantic_complete__"))
        for cls in _subclasses(base):
            if len(self.models) >= MAX_MODELS:
                break
            if id(cls) in self._known or cls.__dict__.get("__pydantic_complete__", True):
                continue
            self._known.add(id(cls))
            self.models.append(cls)
            self.namespaces.append(gc.get_referents(cls.__dict__)[0])
            self.complete.append(False)

    def report(self) -> list[str]:
        """In a rollout's process: the lines that tell the interpreter what it completed."""
        return [
            f"model {n}"
            for n, (namespace, was) in enumerate(zip(self.namespaces, self.complete, strict=True))
            if not was and namespace.get("__pydantic_complete__")
        ]

    def take(self, line: str) -> bool:
        """In the interpreter: act on one untrusted report line; True when it is one of ours (a
        line naming a model the interpreter knows, completed here when it still is not)."""
        kind, _, rest = line.partition(" ")
        if kind != "model" or not rest.isdigit() or int(rest) >= len(self.models):
            return kind == "model"
        n = int(rest)
        if n in self._tried:
            return True
        self._tried.add(n)
        cls = self.models[n]
        if not cls.__dict__.get("__pydantic_complete__"):
            try:  # (its module's namespace; pydantic's own lazy rebuild adds a caller's frame)
                cls.model_rebuild(raise_errors=False, _parent_namespace_depth=0)
            except Exception:
                pass
        self.complete[n] = bool(cls.__dict__.get("__pydantic_complete__"))
        return True


def _subclasses(base: type) -> Iterator[type]:
    seen: set[int] = set()
    todo = [base]
    while todo:
        sub: type
        for sub in type.__subclasses__(todo.pop()):
            if id(sub) not in seen:
                seen.add(id(sub))
                todo.append(sub)
                yield sub


def _tls_calls(module_name: str) -> list[dict[str, Any]]:
    """The keyword arguments the installed libraries call a TLS factory with (one spare each)."""
    if module_name == "httpcore2._ssl":
        return [{}]
    calls: list[dict[str, Any]] = [{}]  # aiohttp, urllib, the openai SDK over httpx 0.28 without certifi
    certifi = sys.modules.get("certifi")
    where = getattr(certifi, "where", None)
    if where is not None:
        try:
            calls.append({"cafile": where()})  # httpx 0.28 (the openai SDK before httpx2)
        except Exception:
            pass
    return calls


def _replace_everywhere(original: Callable[..., Any], replacement: Callable[..., Any]) -> None:
    """Every loaded module's global naming `original` (`from ssl import create_default_context`
    included) names `replacement` instead."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is original:
                namespace[name] = replacement


class _Spare:
    """One TLS factory's spares: a context per argument set, each handed to the first matching
    call of a process (module doc)."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        self.signature = inspect.signature(original)
        self.ready: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}  # key -> (context, basis)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = self._key(args, kwargs)
            made = self.ready.pop(key, None) if key is not None else None
            if key is not None and made is not None and made[1] == _basis(key):
                return made[0]
            return original(*args, **kwargs)

        wrapper.__wrapped_by_rollmesh__ = True  # type: ignore[attr-defined]
        self.wrapper = wrapper

    def _key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        key = tuple(sorted(bound.arguments.items()))
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def fill(self, calls: list[dict[str, Any]]) -> None:
        """A spare for each argument set that has none (the interpreter's own imports may have
        taken one: aiohttp builds a context at import)."""
        if os.environ.get("SSLKEYLOGFILE"):
            return  # (its context would hold the key log opened here: every rollout's keys in one file)
        for kwargs in calls:
            key = self._key((), kwargs)
            if key is None or key in self.ready:
                continue
            basis = _basis(key)
            try:
                context = self.original(**kwargs)
            except Exception:
                continue
            self.ready[key] = (context, basis)


def _basis(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a TLS context built with `key` depends on besides the code: the variables, and each CA
    file or folder it may read (its identity and whether this process may read it)."""
    import ssl

    variables = tuple(os.environ.get(v) for v in _TLS_VARIABLES)
    paths = ssl.get_default_verify_paths()
    candidates = [paths.cafile, paths.capath, paths.openssl_cafile, paths.openssl_capath]
    candidates += [v for k, v in key if k in ("cafile", "capath") and isinstance(v, str)]
    candidates += [v for v in variables[:2] if v]
    files: list[tuple[str, tuple[int, int, int, int, bool] | None]] = []
    for path in dict.fromkeys(p for p in candidates if p):
        try:
            st = os.stat(path)
        except OSError:
            files.append((path, None))
            continue
        mode = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
        files.append((path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, os.access(path, mode))))
    return variables, tuple(files)
