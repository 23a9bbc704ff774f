"""The one place a backend name ("ray-serve", "openai", "fake") becomes a `ModelBackend`.

Heavy backends are imported lazily, so the gateway (and `rollmesh --help`) never imports Ray or
vLLM unless it serves with them; nothing else in the gateway branches on the backend's type.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollmesh.gateway.backends.base import ModelBackend
from rollmesh.gateway.config import ModelSpec
from rollmesh.mesh.config import read
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.errors import RollmeshError


def resolve_model_path(model: str, environ: Mapping[str, str] | None = None) -> Path:
    """A directory as given, else a model name looked up in the artifact roots (registry catalog)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if "/" in model or "\\" in model:
        raise ConfigError(f"model path {model!r} is not a directory")
    from rollmesh.registry import Catalog
    from rollmesh.registry import Kind
    from rollmesh.registry import RootsConfig

    catalog = Catalog.from_config(RootsConfig.from_env(environ))
    return catalog.locate(Kind.MODEL, model).path


def _fake_weights_dir(model: str, environ: Mapping[str, str] | None) -> Path | None:
    """The folder a fake backend pretends to serve (so UpdateWeights works against it), if `model`
    names one; a fake model's name is otherwise just a label."""
    if not model:
        return None
    try:
        return resolve_model_path(model, environ)
    except (ConfigError, RollmeshError):
        return None


def _fake_script(name: str) -> Any:
    """ROLLMESH_FAKE_SCRIPT's `module:function`, imported (None: the fake's default script)."""
    if not name:
        return None
    module, _, function = name.partition(":")
    try:
        script = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"ROLLMESH_FAKE_SCRIPT={name!r} is not an importable module:function ({exc})"
        ) from None
    if not callable(script):
        raise ConfigError(f"ROLLMESH_FAKE_SCRIPT={name!r} is not callable")
    return script


def create_backend(spec: ModelSpec, *, environ: Mapping[str, str] | None = None) -> ModelBackend:
    env = os.environ if environ is None else environ
    if spec.backend == "fake":
        from rollmesh.gateway.backends.fake import FakeBackend

        return FakeBackend(
            spec.name,
            num_replicas=spec.replicas or 1,
            max_model_len=spec.max_model_len or 4096,
            weights_dir=_fake_weights_dir(spec.model, environ),
            first_token_latency_s=float(read("ROLLMESH_FAKE_LATENCY_S", env)),
            script=_fake_script(str(read("ROLLMESH_FAKE_SCRIPT", env))),
        )
    if spec.backend == "openai":
        from rollmesh.gateway.backends.openai import OpenAIBackend

        return OpenAIBackend(
            spec.name,
            base_url=spec.base_url,
            model=spec.model or spec.name,
            api_key=env.get(spec.api_key_env, "") if spec.api_key_env else "",
            max_model_len=spec.max_model_len,
            max_connections=spec.max_connections,
        )
    if spec.backend == "ray-serve":
        from rollmesh.serving.backend import RayServeBackend

        return RayServeBackend.from_env(
            resolve_model_path(spec.model, environ),
            model_name=spec.name,
            replicas=spec.replicas,
            max_model_len=spec.max_model_len or None,
        )
    raise ConfigError(f"unknown backend {spec.backend!r}; use ray-serve, openai or fake")
