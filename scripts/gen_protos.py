"""Generate the Python stubs for protos/rollmesh/v1 into clients/python/rollmesh_client/v1.

protoc writes `from rollmesh.v1 import x_pb2`, which would clash with the server package
`rollmesh`; we generate into a temporary folder and rewrite those imports to
`rollmesh_client.v1`. Versions of the generators are pinned (pyproject.toml) and checked here,
so `make protos` is reproducible and CI can fail on a diff.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tempfile
from pathlib import Path

PINNED = {"grpcio-tools": "1.85.1", "mypy-protobuf": "5.1.0", "protobuf": "7.36.2"}
REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
OUT = REPO / "clients" / "python" / "rollmesh_client" / "v1"
IMPORT_RE = re.compile(r"^from rollmesh\.v1 import", re.MULTILINE)
DOTTED_RE = re.compile(r"\brollmesh\.v1\.(\w+_pb2)\b")


def _check_versions() -> None:
    for dist, want in PINNED.items():
        have = importlib.metadata.version(dist)
        if have != want:
            sys.exit(f"gen_protos: {dist} {have} is installed but {want} is pinned; run `make setup`")


def _googleapis_include() -> str:
    import google.rpc

    return str(Path(next(iter(google.rpc.__path__))).parent.parent)


def generate(out: Path) -> None:
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "rollmesh" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        well_known = str(Path(protoc.__file__).parent / "_proto")
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{_googleapis_include()}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            # The mypy-protobuf plugins live beside this interpreter (no PATH needed).
            f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={Path(sys.executable).parent / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            sys.exit("gen_protos: protoc failed")
        gen = Path(tmp) / "rollmesh" / "v1"
        if out.exists():
            for old in out.glob("*_pb2*"):
                old.unlink()
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(gen.iterdir()):
            text = IMPORT_RE.sub("from rollmesh_client.v1 import", f.read_text())
            text = DOTTED_RE.sub(r"rollmesh_client.v1.\1", text)
            (out / f.name).write_text(text)
        init = ['"""Generated protobuf and gRPC modules for rollmesh.v1 (do not edit; `make protos`)."""', ""]
        (out / "__init__.py").write_text("\n".join(init) + "\n")
        (out / "py.typed").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are stale")
    ns = parser.parse_args()
    _check_versions()
    if not ns.check:
        generate(ns.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            f.name
            for f in sorted(Path(tmp).iterdir())
            if not (ns.out / f.name).exists() or (ns.out / f.name).read_bytes() != f.read_bytes()
        ]
        extra = [f.name for f in ns.out.glob("*_pb2*") if not (Path(tmp) / f.name).exists()]
        if stale or extra:
            sys.exit(f"gen_protos: generated code is stale ({', '.join(stale + extra)}); run `make protos`")


if __name__ == "__main__":
    main()
