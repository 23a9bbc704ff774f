"""Artifact resolution: order, strict and override modes, dedup, collisions, names, sys.path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rollmesh.mesh.config import parse_bool
from rollmesh.mesh.errors import ConfigError
from rollmesh.registry import ArtifactCollision
from rollmesh.registry import ArtifactNotFound
from rollmesh.registry import BadArtifactName
from rollmesh.registry import Catalog
from rollmesh.registry import Kind
from rollmesh.registry import RootsConfig
from rollmesh.registry import UnknownKind
from rollmesh.registry import install_sys_path
from rollmesh.registry import ordered_roots


def make_root(base: Path, name: str, files: dict[str, str]) -> Path:
    root = base / name
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    return root


def cfg(cwd: Path, *extra: Path, root: Path, override: bool = False) -> RootsConfig:
    return RootsConfig(cwd=cwd, extra=tuple(extra), root=root, allow_override=override)


@pytest.fixture
def three_roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    cwd = make_root(tmp_path, "cwd", {"datasets/local.jsonl": "{}\n"})
    extra = make_root(
        tmp_path, "extra", {"datasets/shared.jsonl": "{}\n", "environments/myenv/env.py": "x = 1\n"}
    )
    base = make_root(tmp_path, "base", {"datasets/shared.jsonl": "{}\n{}\n", "models/tiny/config.json": "{}"})
    return cwd, extra, base


def test_roots_in_order_and_deduplicated_by_real_path(
    tmp_path: Path, three_roots: tuple[Path, Path, Path]
) -> None:
    cwd, extra, base = three_roots
    link = tmp_path / "link-to-extra"
    link.symlink_to(extra)
    roots = ordered_roots(cfg(cwd, extra, link, tmp_path / "missing", root=base))
    assert [r.path for r in roots] == [cwd.resolve(), extra.resolve(), base.resolve()]
    assert [r.source for r in roots] == ["cwd", "extra", "root"]
    assert [r.order for r in roots] == [0, 1, 2]


def test_same_root_given_as_cwd_and_root_counts_once(three_roots: tuple[Path, Path, Path]) -> None:
    cwd, _, _ = three_roots
    roots = ordered_roots(cfg(cwd, root=cwd))
    assert len(roots) == 1 and roots[0].source == "cwd"


def test_collision_names_every_path(three_roots: tuple[Path, Path, Path]) -> None:
    cwd, extra, base = three_roots
    cat = Catalog.from_config(cfg(cwd, extra, root=base))
    with pytest.raises(ArtifactCollision) as info:
        cat.resolve(Kind.DATASET, "shared")
    err = info.value
    assert err.reason == "ARTIFACT_COLLISION"
    assert str(extra / "datasets" / "shared.jsonl") in err.message
    assert str(base / "datasets" / "shared.jsonl") in err.message
    assert set(err.metadata.values()) >= {
        str(extra / "datasets/shared.jsonl"),
        str(base / "datasets/shared.jsonl"),
    }


def test_override_mode_earliest_root_wins(three_roots: tuple[Path, Path, Path]) -> None:
    cwd, extra, base = three_roots
    cat = Catalog.from_config(cfg(cwd, extra, root=base, override=True))
    resolved = cat.resolve(Kind.DATASET, "shared")
    assert resolved.path == extra / "datasets" / "shared.jsonl"
    assert resolved.size_bytes == 3
    listed = {a.name: a for a in cat.list_artifacts(Kind.DATASET)}
    assert listed["shared"].collides_with == (base / "datasets" / "shared.jsonl",)


def test_same_name_as_file_and_folder_in_one_root_collides(tmp_path: Path) -> None:
    root = make_root(tmp_path, "r", {"datasets/x.jsonl": "{}", "datasets/x/test.jsonl": "{}"})
    with pytest.raises(ArtifactCollision):
        Catalog.from_config(cfg(root, root=root)).locate(Kind.DATASET, "x")


def test_directory_digest_is_stable_and_lists_files(three_roots: tuple[Path, Path, Path]) -> None:
    cwd, extra, base = three_roots
    cat = Catalog.from_config(cfg(cwd, extra, root=base))
    a = cat.resolve(Kind.MODEL, "tiny")
    b = cat.resolve(Kind.MODEL, "tiny")
    assert a.is_dir and a.files == ("config.json",) and a.sha256 == b.sha256 and len(a.sha256) == 64
    (base / "models/tiny/config.json").write_text('{"changed": true}')
    assert cat.resolve(Kind.MODEL, "tiny").sha256 != a.sha256


@pytest.mark.parametrize(
    "name",
    ["", "  ", "../etc", "a/b", "a\\b", "..", "x\x00y", "/etc/passwd", "a" * 256],
)
def test_bad_names_are_invalid_argument(three_roots: tuple[Path, Path, Path], name: str) -> None:
    cwd, extra, base = three_roots
    with pytest.raises(BadArtifactName) as info:
        Catalog.from_config(cfg(cwd, extra, root=base)).resolve(Kind.DATASET, name)
    assert info.value.code.name == "INVALID_ARGUMENT"


def test_unknown_name_is_not_found(three_roots: tuple[Path, Path, Path]) -> None:
    cwd, extra, base = three_roots
    with pytest.raises(ArtifactNotFound) as info:
        Catalog.from_config(cfg(cwd, extra, root=base)).resolve(Kind.DATASET, "nope")
    assert "nope" in info.value.message and info.value.code.name == "NOT_FOUND"


def test_kind_parsing() -> None:
    assert Kind.parse("dataset") is Kind.DATASET and Kind.parse("Models") is Kind.MODEL
    with pytest.raises(UnknownKind):
        Kind.parse("weights")


def test_files_inside_directory_artifacts_never_escape(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    root = make_root(tmp_path, "r", {"models/m/ok.txt": "ok"})
    (root / "models/m/leak.txt").symlink_to(outside)
    cat = Catalog.from_config(cfg(root, root=root))
    resolved = cat.resolve(Kind.MODEL, "m")
    assert resolved.files == ("ok.txt",)
    located = cat.locate(Kind.MODEL, "m")
    with pytest.raises(ArtifactNotFound):
        cat.file_in(located, "leak.txt")
    with pytest.raises(BadArtifactName):
        cat.file_in(located, "../../secret.txt")


def test_symlinked_artifact_pointing_outside_its_root_is_ignored(tmp_path: Path) -> None:
    elsewhere = make_root(tmp_path, "elsewhere", {"x.jsonl": "{}"})
    root = make_root(tmp_path, "r", {"datasets/keep.jsonl": "{}"})
    (root / "datasets" / "x.jsonl").symlink_to(elsewhere / "x.jsonl")
    names = [a.name for a in Catalog.from_config(cfg(root, root=root)).list_artifacts(Kind.DATASET)]
    assert names == ["keep"]


def test_hidden_private_and_python_entries_are_not_artifacts(tmp_path: Path) -> None:
    root = make_root(
        tmp_path,
        "r",
        {
            "datasets/.hidden.jsonl": "",
            "datasets/_x.jsonl": "",
            "datasets/split.py": "",
            "datasets/ok.jsonl": "",
        },
    )
    assert [a.name for a in Catalog.from_config(cfg(root, root=root)).list_artifacts()] == ["ok"]


def test_sys_path_gets_roots_in_order(
    three_roots: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd, extra, base = three_roots
    monkeypatch.setattr(sys, "path", ["/usr/lib/python3", str(base.resolve())])
    install_sys_path(ordered_roots(cfg(cwd, extra, root=base)))
    assert sys.path[:4] == [str(cwd.resolve()), str(extra.resolve()), str(base.resolve()), "/usr/lib/python3"]


def test_plugin_module_importable_from_earliest_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = make_root(tmp_path, "first", {"rm_plugin_probe.py": "WHO = 'first'\n"})
    second = make_root(tmp_path, "second", {"rm_plugin_probe.py": "WHO = 'second'\n"})
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "rm_plugin_probe", raising=False)
    install_sys_path(ordered_roots(cfg(tmp_path, first, root=second)))
    import rm_plugin_probe  # type: ignore[import-not-found]

    assert rm_plugin_probe.WHO == "first"


def test_roots_config_from_env(tmp_path: Path) -> None:
    env = {
        "ROLLMESH_EXTRA_ROOTS": os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]),
        "ROLLMESH_ROOT": str(tmp_path / "base"),
        "ROLLMESH_ALLOW_ROOT_OVERRIDE": "YES",
    }
    c = RootsConfig.from_env(env, cwd=tmp_path)
    assert c.extra == (tmp_path / "a", tmp_path / "b") and c.root == tmp_path / "base" and c.allow_override


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
    ],
)
def test_parse_bool_accepts_common_spellings(raw: str, want: bool) -> None:
    assert parse_bool("X", raw) is want


def test_parse_bool_rejects_other_values_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="ROLLMESH_ALLOW_ROOT_OVERRIDE"):
        RootsConfig.from_env({"ROLLMESH_ALLOW_ROOT_OVERRIDE": "maybe"})
