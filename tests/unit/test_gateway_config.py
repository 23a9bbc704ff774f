"""GatewayConfig from the environment, and the backend factory."""

from __future__ import annotations

import pytest

from rollmesh.gateway.backends.factory import create_backend
from rollmesh.gateway.backends.factory import resolve_model_path
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.mesh.config import ENV_VARS
from rollmesh.mesh.errors import ConfigError


def test_defaults_serve_tiny_arith_on_ray_serve_with_http_on_8000() -> None:
    cfg = GatewayConfig.from_env(environ={})
    (spec,) = cfg.models
    assert (spec.name, spec.backend, spec.model) == ("tiny-arith", "ray-serve", "tiny-arith")
    assert cfg.default_model == "tiny-arith"
    assert (cfg.server.port, cfg.http_port) == (50053, 8000)


def test_flags_beat_env_and_env_beats_defaults() -> None:
    env = {
        "ROLLMESH_GATEWAY_BACKEND": "openai",
        "ROLLMESH_GATEWAY_BASE_URL": "http://h:1/v1",
        "ROLLMESH_GATEWAY_MODEL": "qwen",
        "ROLLMESH_OPENAI_HTTP_PORT": "9000",
        "ROLLMESH_GATEWAY_MAX_SESSIONS": "7",
    }
    cfg = GatewayConfig.from_env(environ=env)
    assert (cfg.models[0].backend, cfg.models[0].name, cfg.http_port, cfg.max_sessions) == (
        "openai",
        "qwen",
        9000,
        7,
    )
    cfg = GatewayConfig.from_env(environ=env, backend="fake", model="/x/my-model", http_port=0, replicas=3)
    assert (cfg.models[0].backend, cfg.models[0].name, cfg.models[0].replicas, cfg.http_port) == (
        "fake",
        "my-model",
        3,
        0,
    )
    for name in env:
        assert name in ENV_VARS


def test_a_base_url_flag_means_the_openai_backend_unless_another_is_named() -> None:
    url = "http://h:1/v1"
    assert GatewayConfig.from_env(environ={}, base_url=url).models[0].backend == "openai"
    assert GatewayConfig.from_env(environ={"ROLLMESH_GATEWAY_BASE_URL": url}).models[0].backend == "openai"
    env = {"ROLLMESH_GATEWAY_BACKEND": "fake"}  # the environment's choice stands
    assert GatewayConfig.from_env(environ=env, base_url=url).models[0].backend == "fake"
    with pytest.raises(ConfigError, match="--backend ray-serve does not use it"):
        GatewayConfig.from_env(environ={}, base_url=url, backend="ray-serve")


def test_config_errors_give_advice() -> None:
    with pytest.raises(ConfigError, match="base URL"):
        GatewayConfig.from_env(environ={"ROLLMESH_GATEWAY_BACKEND": "openai"})
    with pytest.raises(ConfigError, match="not one of"):
        ModelSpec(name="m", backend="tgi")
    with pytest.raises(ConfigError, match="default model"):
        GatewayConfig(models=(ModelSpec("a", "fake"),), default_model="b")


def test_factory_builds_each_backend_by_name() -> None:
    fake = create_backend(ModelSpec("f", "fake", replicas=2))
    assert isinstance(fake, FakeBackend) and len(fake.replica_ids) == 2
    remote = create_backend(
        ModelSpec("r", "openai", model="qwen", base_url="http://h:1/v1", api_key_env="K"),
        environ={"K": "secret"},
    )
    assert isinstance(remote, OpenAIBackend) and remote.remote_model == "qwen"
    assert remote.supports_token_ids is False


def test_builtin_model_resolves_through_the_registry_catalog() -> None:
    path = resolve_model_path("tiny-arith", environ={})
    assert path.name == "tiny-arith" and (path / "tokenizer_config.json").is_file()
