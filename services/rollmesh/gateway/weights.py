"""Checkpoint compatibility for live weight updates (UpdateWeights).

Contract: `check_checkpoint(candidate, served)` reads only metadata (safetensors headers,
config.json, tokenizer files; no tensor data) and raises `CheckpointIncompatible` naming the first
problem when `candidate` cannot replace the weights of the model served from `served`:
  - no `*.safetensors` in the folder, or a file that is not safetensors;
  - a tensor of the served model missing, an extra tensor, or a shape/dtype that differs;
  - config.json differs in an architecture field (anything but the keys in `_CONFIG_FREE`);
  - the checkpoint ships a tokenizer.json whose vocabulary (`model`, `added_tokens`) differs from the
    served one (another tokenizer). A weights-only checkpoint (no tokenizer.json) is fine: the
    gateway keeps tokenizing with the served tokenizer.
It returns a `CheckpointManifest` (tensor count, bytes) on success. Validation runs before any replica
is touched, so a rejected checkpoint changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmesh.gateway.errors import CheckpointIncompatible
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.errors import InvalidArgument

# config.json keys a training run may legitimately change (not the architecture).
_CONFIG_FREE = frozenset({"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache"})
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointManifest:
    path: Path
    tensors: dict[str, TensorMeta]

    @property
    def total_bytes(self) -> int:
        """Bytes of the checkpoint's safetensors files (what bounds an UploadWeights)."""
        return sum(f.stat().st_size for f in self.path.glob("*.safetensors"))


def _incompatible(path: Path, problem: str) -> CheckpointIncompatible:
    return CheckpointIncompatible(
        f"checkpoint {path} cannot replace the served weights: {problem}",
        metadata={"checkpoint": str(path), "problem": problem},
    )


def _header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("shorter than a safetensors header")
        (size,) = struct.unpack("<Q", raw)
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"header of {size} bytes is not plausible")
        header = untrusted_json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def read_manifest(path: Path) -> CheckpointManifest:
    """Tensor names, dtypes and shapes of every safetensors file in `path` (headers only)."""
    if not path.is_dir():
        raise _incompatible(path, "not a directory")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise _incompatible(path, "no *.safetensors file")
    tensors: dict[str, TensorMeta] = {}
    for file in files:
        try:
            header = _header(file)
            metas = {n: _tensor(m) for n, m in header.items() if n != "__metadata__"}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise _incompatible(path, f"{file.name} is not a readable safetensors file ({exc})") from None
        for name, meta in metas.items():
            if name in tensors:
                raise _incompatible(path, f"tensor {name} appears in two files")
            tensors[name] = meta
    return CheckpointManifest(path, tensors)


def _tensor(meta: dict[str, Any]) -> TensorMeta:
    return TensorMeta(str(meta.get("dtype")), tuple(int(d) for d in meta.get("shape", ())))


def _config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        return {}
    try:
        loaded = untrusted_json.loads(file.read_text())
    except ValueError as exc:
        raise _incompatible(path, f"config.json is not JSON ({exc})") from None
    return loaded if isinstance(loaded, dict) else {}


def _vocabulary(path: Path) -> str:
    """A digest of tokenizer.json's vocabulary and added tokens ("" when there is none)."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return ""
    try:
        loaded = untrusted_json.loads(file.read_text())
    except ValueError as exc:
        raise _incompatible(path, f"tokenizer.json is not JSON ({exc})") from None
    if not isinstance(loaded, dict):
        raise _incompatible(path, "tokenizer.json is not a JSON object")
    vocab = {"model": loaded.get("model"), "added_tokens": loaded.get("added_tokens")}
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest()


def check_checkpoint(candidate: Path, served: Path) -> CheckpointManifest:
    """Raise `CheckpointIncompatible` unless `candidate` fits the model served from `served`."""
    new = read_manifest(candidate)
    old = read_manifest(served)
    missing = sorted(set(old.tensors) - set(new.tensors))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _incompatible(candidate, f"tensor {missing[0]} is missing{more}")
    extra = sorted(set(new.tensors) - set(old.tensors))
    if extra:
        raise _incompatible(candidate, f"tensor {extra[0]} is not in the served model")
    for name, meta in old.tensors.items():
        got = new.tensors[name]
        if got.shape != meta.shape:
            raise _incompatible(
                candidate, f"tensor {name} has shape {list(got.shape)}, served {list(meta.shape)}"
            )
        if got.dtype != meta.dtype:
            raise _incompatible(candidate, f"tensor {name} has dtype {got.dtype}, served {meta.dtype}")
    new_cfg, old_cfg = _config(candidate), _config(served)
    if new_cfg:
        for key in sorted((set(new_cfg) | set(old_cfg)) - _CONFIG_FREE):
            if new_cfg.get(key) != old_cfg.get(key):
                raise _incompatible(
                    candidate, f"config.json {key} is {new_cfg.get(key)!r}, served {old_cfg.get(key)!r}"
                )
    theirs = _vocabulary(candidate)
    if theirs and theirs != _vocabulary(served):
        raise _incompatible(candidate, "tokenizer.json has another vocabulary than the served model's")
    return new


def next_version(previous: str) -> str:
    """The version after `previous` when the caller names none: integers count up from "1"."""
    if not previous:
        return "1"
    if previous.isdigit():
        return str(int(previous) + 1)
    raise InvalidArgument(
        f"give policy_version: the current version {previous!r} is not an integer to count up from",
        metadata={"field": "policy_version"},
    )
