"""The verifiers bridge's pure parts: verifiers.toml (what it requires, what it resolves, what it
refuses, in one line naming the file) and a /score answer read as a verdict (no numeric reward is a
named failure, never a reward)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmesh.mesh.errors import ConfigError
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.verifiers_env import LAUNCHER
from rollmesh.verifier.bridges.verifiers_env import LAUNCHER_V1
from rollmesh.verifier.bridges.verifiers_env import VerifiersConfig
from rollmesh.verifier.bridges.verifiers_env import score_result
from rollmesh.verifier.config import facade_url
from rollmesh.verifier.errors import EnvServerBadReply


def config(tmp_path: Path, text: str) -> VerifiersConfig:
    (tmp_path / "verifiers.toml").write_text(text)
    return VerifiersConfig.load(tmp_path)


def test_a_config_resolves_its_venv_and_paths_against_its_folder(tmp_path: Path) -> None:
    cfg = config(tmp_path, 'env_id = "vf_x"\nvenv = "/opt/vf"\npaths = [".", "src"]\n[args]\nmax_turns = 3\n')
    assert cfg.python == "/opt/vf/bin/python" and cfg.interpreter() == "/opt/vf/bin/python"
    assert cfg.paths == (str(tmp_path.resolve()), str((tmp_path / "src").resolve()))
    assert cfg.job() == {"env_id": "vf_x", "args": {"max_turns": 3}, "paths": list(cfg.paths), "judge": None}
    assert cfg.launcher == LAUNCHER


def test_a_taskset_config_is_served_by_the_v1_server_with_its_config_and_judge(tmp_path: Path) -> None:
    cfg = config(tmp_path, 'taskset = "vf_t"\npython = "/p"\n[[config.task.judges]]\nid = "reference"\n')
    judge = {"base_url": "http://127.0.0.1:1/v1", "model": "", "api_key_var": "K"}
    assert cfg.launcher == LAUNCHER_V1 and cfg.name == "vf_t"
    assert cfg.job(judge) == {
        "taskset": "vf_t",
        "config": {"task": {"judges": [{"id": "reference"}]}},
        "paths": [],
        "judge": judge,
    }


def test_the_judge_url_defaults_to_the_gateways_openai_facade() -> None:
    env = {"ROLLMESH_GATEWAY_ADDR": "10.0.0.5:50052", "ROLLMESH_OPENAI_HTTP_PORT": "8001"}
    assert facade_url(env) == "http://10.0.0.5:8001/v1"
    assert facade_url({**env, "ROLLMESH_OPENAI_HTTP_PORT": "-1"}) == ""
    assert VerifierConfig.from_env(
        environ={**env, "ROLLMESH_VERIFIER_JUDGE_URL": "http://j/v1"}
    ).judge_url == ("http://j/v1")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('python = "/x"\n', "one of `env_id`, `taskset`"),
        ('env_id = "a"\ntaskset = "b"\n', "one of `env_id`, `taskset`"),
        ('taskset = "b"\n[args]\nk = 1\n', "a taskset takes [config]"),
        ('env_id = "a"\n[config]\nk = 1\n', "env_id takes [args]"),
        ('env_id = "vf_x"\nserver = "y"\n', "unknown keys server"),
        ('env_id = "vf_x"\npaths = "."\n', "`paths` must be a list"),
        ('env_id = "vf_x"\nargs = 3\n', "[args] must be a table"),
        ('env_id = "vf_x"\n[args\n', "verifiers.toml"),
    ],
)
def test_a_config_that_does_not_fit_is_one_line_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(tmp_path, text)
    message = str(err.value)
    assert says in message and "verifiers.toml" in message and "\n" not in message


def test_no_interpreter_is_a_config_error_naming_the_ways_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROLLMESH_VERIFIERS_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="ROLLMESH_VERIFIERS_PYTHON"):
        config(tmp_path, 'env_id = "vf_x"\n').interpreter()


def test_a_score_answer_is_the_reward_and_its_metrics() -> None:
    got = score_result({"reward": 1.25, "metrics": {"correct": 1.0, "n": 3, "bad": "x", "flag": True}}, "w")
    assert got.reward == 1.25 and got.components == {"correct": 1.0, "n": 3.0}


@pytest.mark.parametrize("reward", [None, "1.0", True])
def test_a_score_answer_without_a_numeric_reward_is_a_named_failure(reward: object) -> None:
    with pytest.raises(EnvServerBadReply, match="numeric reward"):
        score_result({"reward": reward}, "verifiers environment 'x'")
