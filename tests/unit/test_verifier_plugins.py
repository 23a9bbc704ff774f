"""Plugin API and discovery: schema inference, roots, collisions, broken plugins, entry points."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path
from typing import Any

import grpc
import pytest

from rollmesh.mesh.errors import Internal
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.errors import ArtifactCollision
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import tool
from rollmesh.verifier.bridges import kinds
from rollmesh.verifier.environment import infer_parameters
from rollmesh.verifier.environment import schema_errors
from rollmesh.verifier.errors import EnvironmentBroken
from rollmesh.verifier.errors import EnvironmentNotFound
from rollmesh.verifier.loader import module_name_for
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall

PLUGIN = '''
from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult, tool


class Echo(Environment):
    """Echo: reward 1 when the answer repeats the prompt."""

    @tool
    async def shout(self, session: Session, text: str, times: int = 1) -> str:
        """Upper-case text."""
        return text.upper() * times

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        ok = response.final_text == task.prompt
        return VerifyResult(1.0 if ok else 0.0, {"echo": 1.0 if ok else 0.0}, response.final_text)
'''


def make_root(base: Path, envs: dict[str, str]) -> Path:
    for name, source in envs.items():
        folder = base / "environments" / name
        folder.mkdir(parents=True)
        (folder / "env.py").write_text(textwrap.dedent(source))
    return base


def service_for(extra: list[Path], *, allow_override: bool = False) -> VerifierService:
    roots = RootsConfig(Path("/nonexistent"), tuple(extra), BUILTIN_ROOT, allow_override)
    return VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)


def test_tool_schema_is_inferred_from_hints() -> None:
    class T(Environment):
        @tool
        async def f(self, session: Session, a: int, b: str = "x", c: list[int] | None = None) -> str:
            """Does f.

            More text."""
            return ""

        def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
            return VerifyResult(0.0)

    (spec,) = T.tool_specs()
    assert spec.description == "Does f."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "string"},
            "c": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    assert infer_parameters(T.f)["required"] == ["a"]
    assert schema_errors({"a": True}, spec.parameters) == ["arguments.a must be integer, got bool"]
    assert schema_errors({"a": 1, "c": [1, "x"]}, spec.parameters) == [
        "arguments.c[1] must be integer, got str"
    ]


def test_builtins_do_not_shadow_the_stdlib() -> None:
    svc = service_for([])
    infos, broken = svc.list_environments()
    assert {"arithmetic", "math", "code", "single_tool_call", "session_state"} <= {i.name for i in infos}
    assert broken == []
    import math

    assert sys.modules["math"] is math and hasattr(math, "sqrt")
    assert module_name_for(BUILTIN_ROOT / "environments" / "math" / "env.py").startswith("rollmesh_env_math_")


async def test_plugin_in_an_extra_root_is_discovered(tmp_path: Path) -> None:
    root = make_root(tmp_path / "plugins", {"echo": PLUGIN})
    svc = service_for([root])
    info = svc.describe("echo")
    assert info.description.startswith("Echo: reward 1")
    assert info.source == str(root.resolve() / "environments" / "echo" / "env.py")
    assert [t.name for t in info.tools] == ["shout"]
    task = '{"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}}'
    result = await svc.verify(VerifyCall("echo", task, Response.from_text("hi")))
    assert result.reward == 1.0


BAD_REWARDS = {"nan": "float('nan')", "inf": "float('inf')", "text": "'1.0'", "none": "None"}
BAD_REWARD_PLUGIN = """
from rollmesh.verifier import Environment, VerifyResult


class Bad(Environment):
    def verify(self, task, response, session=None):
        value = {value}
        return VerifyResult({reward}, {{"part": {component}}})
"""


@pytest.mark.parametrize("where", ["reward", "component"])
@pytest.mark.parametrize("bad", sorted(BAD_REWARDS))
async def test_a_reward_that_is_not_a_finite_number_fails_the_verify(
    tmp_path: Path, bad: str, where: str
) -> None:
    reward, component = ("value", "1.0") if where == "reward" else ("1.0", "value")
    source = BAD_REWARD_PLUGIN.format(value=BAD_REWARDS[bad], reward=reward, component=component)
    svc = service_for([make_root(tmp_path / "plugins", {"bad": source})])
    with pytest.raises(Internal, match="not a finite number"):
        await svc.verify(VerifyCall("bad", "{}", Response.from_text("x")))


def test_collision_with_a_builtin_is_the_registrys_error(tmp_path: Path) -> None:
    root = make_root(tmp_path / "plugins", {"arithmetic": PLUGIN, "echo": PLUGIN})
    svc = service_for([root])
    infos, broken = svc.list_environments()
    assert "arithmetic" not in {i.name for i in infos} and "echo" in {i.name for i in infos}
    (entry,) = [b for b in broken if b.name == "arithmetic"]
    assert "defined in 2 places" in entry.error
    with pytest.raises(ArtifactCollision) as err:
        svc.describe("arithmetic")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and err.value.reason == "ARTIFACT_COLLISION"
    # with the override the earliest root (the plugin) wins
    override = service_for([root], allow_override=True)
    assert override.describe("arithmetic").source.startswith(str(root.resolve()))


def test_broken_plugin_is_listed_and_the_rest_work(tmp_path: Path) -> None:
    root = make_root(
        tmp_path / "plugins",
        {
            "syntax": "def oops(:\n",
            "abstract": "from rollmesh.verifier import Environment\nclass A(Environment):\n    pass\n",
            "raises": "raise RuntimeError('boom at import')\n",
            "echo": PLUGIN,
        },
    )
    (root / "environments" / "noenv").mkdir()
    svc = service_for([root])
    infos, broken = svc.list_environments()
    by_name = {b.name: b for b in broken}
    assert set(by_name) == {"syntax", "abstract", "raises", "noenv"}
    assert by_name["syntax"].error.startswith("SyntaxError")
    assert "boom at import" in by_name["raises"].error
    assert "found 0" in by_name["abstract"].error
    assert {"echo", "arithmetic"} <= {i.name for i in infos}
    with pytest.raises(EnvironmentBroken) as err:
        svc.describe("syntax")
    assert err.value.reason == "ENVIRONMENT_BROKEN" and "SyntaxError" in err.value.message
    with pytest.raises(EnvironmentNotFound):
        svc.describe("nope")


class EntryEnv(Environment):
    """From an entry point."""

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(0.5)


def test_entry_points_load_and_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [
        importlib.metadata.EntryPoint("from_ep", f"{__name__}:EntryEnv", "rollmesh.environments"),
        importlib.metadata.EntryPoint("arithmetic", f"{__name__}:EntryEnv", "rollmesh.environments"),
        importlib.metadata.EntryPoint("bad_ep", "no_such_module_xyz:Nope", "rollmesh.environments"),
    ]

    def fake(**kw: Any) -> list[importlib.metadata.EntryPoint]:
        assert kw == {"group": "rollmesh.environments"}
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots))
    assert svc.describe("from_ep").source == f"entry-point:{__name__}:EntryEnv"
    _, broken = svc.list_environments()
    names = {b.name: b for b in broken}
    assert "ModuleNotFoundError" in names["bad_ep"].error
    with pytest.raises(ArtifactCollision):
        svc.describe("arithmetic")


def test_a_folder_kind_is_found_through_the_registry_of_kinds(tmp_path: Path) -> None:
    """The loader imports no kind: a folder with no env.py is of the registered kind whose config
    file it holds (the first registered when several); each built-in kind's class reads the file it
    registered; a folder with none of them names every one."""
    for kind in kinds.folder_kinds():
        cls = kind.environment()
        assert sys.modules[cls.__module__].CONFIG_FILE == kind.config_file, kind.what
    assert [k.config_file for k in kinds.folder_kinds()][:2] == ["nemo_gym.toml", "verifiers.toml"]

    class Marked(EntryEnv):
        """A folder marked by its own file."""

    root = make_root(tmp_path / "plugins", {})
    (root / "environments" / "marked").mkdir(parents=True)
    (root / "environments" / "marked" / "t_marked.toml").write_text("")
    (root / "environments" / "bare").mkdir()
    kind = kinds.FolderKind("t_marked.toml", "a test kind", lambda: Marked)
    try:  # the registry is process-wide: the test's kind leaves it whatever happens
        kinds.register_folder_kind(kind)
        kinds.register_folder_kind(kind)  # the same kind again: nothing changes
        with pytest.raises(ValueError, match="already marks a test kind"):
            kinds.register_folder_kind(kinds.FolderKind("t_marked.toml", "another", lambda: Marked))
        svc = service_for([root])
        infos, broken = svc.list_environments()
    finally:
        kinds._KINDS.pop("t_marked.toml", None)
    marked = next(i for i in infos if i.name == "marked")
    assert marked.description == "A folder marked by its own file." and marked.source.endswith(
        "t_marked.toml"
    )
    (bare,) = [b for b in broken if b.name == "bare"]
    assert "has no env.py (nor any of nemo_gym.toml, verifiers.toml, container_tasks.toml" in bare.error
