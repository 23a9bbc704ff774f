"""rollmesh: a typed gRPC mesh that collects LLM rollouts against verifiable environments."""

__version__ = "0.1.0"
