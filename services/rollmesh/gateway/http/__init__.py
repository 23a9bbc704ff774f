"""The OpenAI-compatible HTTP facade, split by concern as vLLM's entrypoints are: `protocol` (the
OpenAI wire format <-> gateway types), `streaming` (SSE), `routes` (FastAPI), `server` (uvicorn)."""

from rollmesh.gateway.http.server import HttpFacade

__all__ = ["HttpFacade"]
