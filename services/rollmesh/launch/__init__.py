"""Launching the mesh: all four services in one process (`rollmesh run`'s embedded default) or as
separate processes (`rollmesh up`), and checking a running mesh (`rollmesh status`)."""

from rollmesh.launch.embedded import embedded_mesh

__all__ = ["embedded_mesh"]
