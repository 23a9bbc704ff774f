"""Harbor's task format as the container-task kind reads it (verifier/bridges/container): task.toml in
both schemas, one-line errors for bad tasks, the verdict files, Dockerfiles, compose files and the
image map. No machine runs here (tests/integration/test_container_tasks.py runs them)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rollmesh.mesh.errors import ConfigError
from rollmesh.verifier.bridges.container import rewards
from rollmesh.verifier.bridges.container.env import read_settings
from rollmesh.verifier.bridges.container.errors import BadHarborTask
from rollmesh.verifier.bridges.container.errors import BadRewardFile
from rollmesh.verifier.bridges.container.errors import ImageBuildFailed
from rollmesh.verifier.bridges.container.errors import NoRewardFile
from rollmesh.verifier.bridges.container.errors import TestScriptFailed
from rollmesh.verifier.bridges.container.images import mapped
from rollmesh.verifier.bridges.container.images import parse_dockerfile
from rollmesh.verifier.bridges.container.images import parse_image_map
from rollmesh.verifier.bridges.container.images import recipe
from rollmesh.verifier.bridges.container.task import ROW_KEY
from rollmesh.verifier.bridges.container.task import load_task
from rollmesh.verifier.bridges.container.task import load_tasks
from rollmesh.verifier.bridges.container.task import rows

TASKS = Path(__file__).resolve().parents[1] / "container_tasks" / "environments" / "harbor_demo" / "tasks"
MAP = {"ubuntu:24.04": "rollmesh-base:bookworm", "debian:bookworm-slim": "rollmesh-base:bookworm"}


def _task(tmp_path: Path, toml: str, *, dockerfile: str = "FROM ubuntu:24.04\n", name: str = "t") -> Path:
    folder = tmp_path / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text("Do it.")
    (folder / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    if dockerfile:
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    return folder


def test_the_current_schema_gives_timeouts_limits_and_the_task_table() -> None:
    task = load_task(TASKS / "fix-calc")
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (120.0, 120.0, 600.0)
    assert (task.limits.cpus, task.limits.memory_mb, task.limits.allow_internet) == (1.0, 512, False)
    assert task.metadata["name"] == "rollmesh/fix-calc"
    assert task.has_solution and task.instruction.startswith("The function `add`")


def test_the_older_flat_metadata_schema_gives_sizes_as_text_and_allow_internet() -> None:
    task = load_task(TASKS / "answer-json")
    assert (task.limits.memory_mb, task.limits.storage_mb, task.limits.allow_internet) == (1024, 512, False)
    assert task.metadata["difficulty"] == "easy" and task.metadata["tags"] == ["json"]
    assert task.solution_env == {"ANSWER": "42"}


def test_no_network_unless_the_task_asks_for_it(tmp_path: Path) -> None:
    assert not load_task(_task(tmp_path, "", name="a")).limits.allow_internet
    assert load_task(
        _task(tmp_path, "[environment]\nallow_internet = true\n", name="b")
    ).limits.allow_internet
    public = _task(tmp_path, '[environment]\nnetwork_mode = "public"\n', name="c")
    assert load_task(public).limits.allow_internet


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[agent\n", "task.toml is not readable TOML"),
        ('[agent]\ntimeout_sec = "soon"\n', "[agent] timeout_sec must be a positive number"),
        ("[verifier]\ntimeout_sec = -1\n", "[verifier] timeout_sec must be a positive number"),
        ('[environment]\nmemory = "lots"\n', "[environment] memory must look like '2G'"),
        ('[environment]\nnetwork_mode = "allowlist"\n', "network_mode = 'allowlist' is not supported"),
        ("[environment]\ngpus = 1\n", "[environment] gpus: accelerators are not supported"),
        ('[verifier]\nenvironment_mode = "separate"\n', "a separate verifier environment"),
        ('[[steps]]\nname = "one"\n', "multi-step tasks (`steps`) are not supported"),
        ("[verifier]\nenv = 3\n", "[verifier] env must be a table of strings"),
        ('artifacts = ["/app/out"]\n', "artifacts is not supported"),
        ('[[verifier.collect]]\ncommand = "x"\n', "[verifier] collect is not supported"),
        ('[environment.healthcheck]\ncommand = "true"\n', "[environment] healthcheck is not supported"),
    ],
)
def test_a_bad_task_is_one_line_naming_the_task_and_the_field(tmp_path: Path, toml: str, says: str) -> None:
    with pytest.raises(BadHarborTask) as caught:
        load_task(_task(tmp_path, toml))
    assert says in caught.value.message and "task 't'" in caught.value.message
    assert "\n" not in caught.value.message


def test_a_task_without_instruction_tests_or_environment_is_refused(tmp_path: Path) -> None:
    folder = _task(tmp_path, "")
    (folder / "instruction.md").unlink()
    with pytest.raises(BadHarborTask, match=r"no instruction\.md"):
        load_task(folder)
    bare = _task(tmp_path, "", dockerfile="", name="bare")
    with pytest.raises(BadHarborTask, match=r"no Dockerfile nor docker-compose\.yaml"):
        load_task(bare)
    with pytest.raises(BadHarborTask, match="no Harbor task here"):
        load_tasks(tmp_path / "bare" / "environment")


def test_a_folder_of_tasks_is_a_dataset_of_their_instructions_in_name_order() -> None:
    found = list(rows(TASKS))
    names = [r["task_id"] for r in found]
    assert names == sorted(names) and "fix-calc" in names and len(names) >= 8
    row = next(r for r in found if r["task_id"] == "hello-file")
    assert row["verifier_metadata"] == {ROW_KEY: "hello-file"}
    assert row["responses_create_params"]["input"][0]["content"].startswith("Create the file /app/hello.txt")


def test_reward_json_wins_and_every_named_reward_is_kept() -> None:
    named = json.dumps({"reward": 0.5, "style": 1, "speed": 0.25}).encode()
    verdict = rewards.parse(named, b"1", key="reward", exit_code=0, output_tail="", task="t")
    assert (verdict.reward, verdict.source) == (0.5, "reward.json")
    assert verdict.named == {"reward": 0.5, "style": 1.0, "speed": 0.25}
    chosen = rewards.parse(named, None, key="style", exit_code=0, output_tail="", task="t")
    assert chosen.reward == 1.0
    single = rewards.parse(b'{"score": 0.75}', None, key="reward", exit_code=0, output_tail="", task="t")
    assert single.reward == 0.75


@pytest.mark.parametrize(
    ("reward_json", "reward_txt", "exit_code", "error", "says"),
    [
        (None, b"probably\n", 0, BadRewardFile, "reward.txt is not a number"),
        (None, b"", 0, BadRewardFile, "reward.txt is not a number"),
        (None, b"nan", 0, BadRewardFile, "not a finite number"),
        (b"{not json", None, 0, BadRewardFile, "reward.json is not JSON"),
        (b'{"reward": "1"}', None, 0, BadRewardFile, "'reward' is not a finite number"),
        (b'{"a": 1, "b": 0}', None, 0, BadRewardFile, "reward.json has no 'reward'"),
        (b"[1, 2]", None, 0, BadRewardFile, "must be an object of named numbers"),
        (None, None, 0, NoRewardFile, "without writing /logs/verifier/reward.txt"),
        (None, None, 3, TestScriptFailed, "exited 3 without writing a reward: boom"),
    ],
)
def test_a_verdict_that_cannot_be_read_is_a_named_failure_never_zero(
    reward_json: bytes | None, reward_txt: bytes | None, exit_code: int, error: type[Exception], says: str
) -> None:
    with pytest.raises(error) as caught:
        rewards.parse(
            reward_json, reward_txt, key="reward", exit_code=exit_code, output_tail="boom\n", task="t"
        )
    assert says in str(caught.value)


def test_a_test_script_that_wrote_its_reward_counts_whatever_its_exit_status() -> None:
    verdict = rewards.parse(None, b"0\n", key="reward", exit_code=1, output_tail="", task="t")
    assert verdict.reward == 0.0


def test_dockerfile_lines_join_and_keep_their_form() -> None:
    steps = parse_dockerfile(
        "# comment\nFROM ubuntu:24.04 AS base\nRUN apt-get update && \\\n    apt-get install -y x\n"
        'CMD ["sleep", "infinity"]\nCOPY --chown=1:1 "a b" /dst/\nENV A=1 B="two words"\n',
        where="t",
    )
    assert [s.keyword for s in steps] == ["FROM", "RUN", "CMD", "COPY", "ENV"]
    assert steps[1].args == ("apt-get update &&  apt-get install -y x",) and steps[1].line == 3
    assert steps[2].json_form and steps[2].args == ("sleep", "infinity")
    assert steps[3].flags == {"chown": "1:1"} and steps[3].args == ("a b", "/dst/")


def test_the_image_map_renames_bases_and_multi_stage_builds_are_refused(tmp_path: Path) -> None:
    assert parse_image_map("ubuntu:24.04=registry.local/ubuntu:24.04, python=reg/python") == {
        "ubuntu:24.04": "registry.local/ubuntu:24.04",
        "python": "reg/python",
    }
    assert mapped("python:3.12-slim", {"python": "reg/python"}) == "reg/python:3.12-slim"
    with pytest.raises(ValueError, match="not FROM=TO"):
        parse_image_map("ubuntu")
    task = load_task(_task(tmp_path, "", dockerfile="FROM ubuntu:24.04 AS a\nFROM a\n"))
    with pytest.raises(ImageBuildFailed, match="multi-stage"):
        recipe(task, MAP)


def test_a_compose_task_builds_its_main_service_with_its_environment() -> None:
    task = load_task(TASKS / "compose-greeting")
    made = recipe(task, MAP)
    assert made.base == "rollmesh-base:bookworm"
    assert made.environment == {"GREETING": "hello from compose"}
    assert [s.keyword for s in made.steps] == ["WORKDIR"]


def test_a_compose_file_without_a_main_service_is_a_bad_task(tmp_path: Path) -> None:
    folder = _task(tmp_path, "", dockerfile="")
    compose = folder / "environment" / "docker-compose.yaml"
    compose.write_text("services:\n  web:\n    image: x\n")
    with pytest.raises(BadHarborTask, match="no `services: main:`"):
        recipe(load_task(folder), MAP)


def test_a_compose_files_other_services_come_with_their_images_commands_and_healthchecks() -> None:
    made = recipe(load_task(TASKS.parent.parent / "compose_services" / "tasks" / "side-service"), MAP)
    assert made.base == "rollmesh-base:bookworm" and [s.keyword for s in made.steps] == ["WORKDIR"]
    (notes,) = made.services
    assert (notes.name, notes.recipe.base, notes.recipe.steps) == ("notes", "rollmesh-base:bookworm", ())
    assert notes.recipe.environment == {"NOTE": "the side service says hello"}
    assert notes.command is not None and notes.command[-1].startswith('mkdir -p /srv && echo "$NOTE"')
    assert notes.healthcheck is not None and notes.healthcheck.test[:2] == ("CMD", "python3")
    assert (notes.healthcheck.interval_s, notes.healthcheck.timeout_s, notes.healthcheck.retries) == (
        1,
        5,
        30,
    )
    assert made.digest("base") == dataclasses.replace(made, services=()).digest("base")


@pytest.mark.parametrize(
    ("service", "says"),
    [
        (
            "    image: postgres\n    volumes: [data:/var/lib]\n",
            "services.db uses volumes, which rollmesh does not run",
        ),
        ("    image: postgres\n    command: echo ${HOME}\n", "compose variable interpolation (${...)"),
        (
            "    image: postgres\n    healthcheck: {test: [CMD, x], interval: soon}\n",
            "'soon' is not a duration",
        ),
        ("    command: x\n", "services.db has neither `build` nor `image`"),
    ],
)
def test_what_a_side_service_cannot_be_is_refused_by_name(tmp_path: Path, service: str, says: str) -> None:
    folder = _task(tmp_path, "", dockerfile="")
    (folder / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    image: ubuntu:24.04\n  db:\n" + service
    )
    with pytest.raises(BadHarborTask) as caught:
        recipe(load_task(folder), MAP)
    assert says in caught.value.message and "task 't'" in caught.value.message


def test_the_docker_provider_writes_each_step_back_as_a_dockerfile_line() -> None:
    from rollmesh.verifier.bridges.container.docker import _line

    steps = parse_dockerfile(
        'FROM x\nRUN a && \\\n  b\nCOPY --chown=1:1 "a b" /d/\nCMD ["sleep", "1"]\nENV A=1\n', where="t"
    )
    assert [_line(s) for s in steps[1:]] == [
        "RUN a &&  b",
        'COPY --chown=1:1 ["a b", "/d/"]',
        'CMD ["sleep", "1"]',
        "ENV A=1",
    ]


def test_an_image_digest_follows_the_context_files(tmp_path: Path) -> None:
    folder = _task(tmp_path, "", dockerfile="FROM ubuntu:24.04\nCOPY app.py /app/\n")
    (folder / "environment" / "app.py").write_text("print(1)\n")
    first = recipe(load_task(folder), MAP).digest("base")
    assert recipe(load_task(folder), MAP).digest("base") == first
    (folder / "environment" / "app.py").write_text("print(2)\n")
    assert recipe(load_task(folder), MAP).digest("base") != first


def test_harbors_own_template_reads_as_written() -> None:
    """`harbor tasks init rollmesh/harbor-template --verifier-mode shared --no-pytest` (harbor 0.25)."""
    root = TASKS.parent.parent / "harbor_template" / "tasks"
    task = load_task(root / "harbor-template")
    assert task.metadata["name"] == "rollmesh/harbor-template" and task.metadata["version"] == "1.0.0"
    assert (task.agent_timeout_s, task.verifier_timeout_s) == (600.0, 600.0)
    assert task.limits.allow_internet  # its network_mode = "public"
    assert recipe(task, MAP).base == "rollmesh-base:bookworm"


def test_harbors_default_template_with_a_separate_verifier_is_refused_by_name(tmp_path: Path) -> None:
    """What `harbor tasks init` writes by default: a verifier in its own environment."""
    toml = (
        'schema_version = "1.4"\nartifacts = []\n\n[task]\nname = "o/t"\n\n[verifier]\ntimeout_sec = 600.0\n'
        'environment_mode = "separate"\ncollect = []\n\n[environment]\nnetwork_mode = "public"\n'
    )
    with pytest.raises(BadHarborTask, match="a separate verifier environment"):
        load_task(_task(tmp_path, toml))


@pytest.mark.parametrize(("raw", "on"), [("", True), ("1", True), ("on", True), ("0", False), ("off", False)])
def test_user_namespaces_read_rollmesh_container_userns_as_every_boolean_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str, on: bool
) -> None:
    """It was read by hand: "off" (a boolean everywhere else) kept them on, and so did any typo."""
    from rollmesh.verifier.bridges.container.daemonless import user_namespaces

    monkeypatch.setenv("ROLLMESH_CONTAINER_USERNS", raw)
    assert user_namespaces() is on


def test_a_container_userns_that_is_not_a_boolean_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollmesh.verifier.bridges.container.daemonless import user_namespaces

    monkeypatch.setenv("ROLLMESH_CONTAINER_USERNS", "of")
    with pytest.raises(ConfigError, match="ROLLMESH_CONTAINER_USERNS='of' is not a boolean"):
        user_namespaces()


def _settings_folder(folder: Path, monkeypatch: pytest.MonkeyPatch, toml: str) -> None:
    """`folder` holds container_tasks.toml with `toml`, and no container variable overrides it."""
    for name in ("ROLLMESH_CONTAINER_PROVIDER", "ROLLMESH_CONTAINER_WARM", "ROLLMESH_IMAGE_MAP"):
        monkeypatch.delenv(name, raising=False)
    (folder / "container_tasks.toml").write_text(toml)


def test_a_container_userns_typo_fails_the_environments_provider_not_the_first_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was read as each machine started: a verifier with a typo loaded, then failed rollouts."""
    from rollmesh.verifier.bridges.container.daemonless import DaemonlessProvider
    from rollmesh.verifier.bridges.container.env import make_provider

    _settings_folder(tmp_path, monkeypatch, 'provider = "daemonless"\n')
    monkeypatch.setenv("ROLLMESH_CONTAINER_USERNS", "of")
    with pytest.raises(ConfigError, match="ROLLMESH_CONTAINER_USERNS='of' is not a boolean"):
        make_provider(read_settings(tmp_path), tmp_path)
    monkeypatch.setenv("ROLLMESH_CONTAINER_USERNS", "off")
    provider = make_provider(read_settings(tmp_path), tmp_path)
    assert isinstance(provider, DaemonlessProvider)
    assert provider.user_namespaces is False


def test_the_container_variables_win_over_container_tasks_toml_and_a_bad_warm_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settings_folder(tmp_path, monkeypatch, 'provider = "docker"\nwarm = 2\n')
    assert (read_settings(tmp_path).provider, read_settings(tmp_path).warm) == ("docker", 2)
    monkeypatch.setenv("ROLLMESH_CONTAINER_PROVIDER", "daemonless")
    monkeypatch.setenv("ROLLMESH_CONTAINER_WARM", "3")
    monkeypatch.setenv("ROLLMESH_IMAGE_MAP", "a=b")
    got = read_settings(tmp_path)
    assert (got.provider, got.warm, got.image_map) == ("daemonless", 3, {"a": "b"})
    monkeypatch.setenv("ROLLMESH_CONTAINER_WARM", "three")  # was a ValueError traceback
    with pytest.raises(ConfigError, match="ROLLMESH_CONTAINER_WARM='three' is not an integer"):
        read_settings(tmp_path)
