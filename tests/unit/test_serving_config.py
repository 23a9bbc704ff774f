"""ServingConfig: env vars, overrides, validation and what a replica is given (no Ray, no vLLM)."""

from __future__ import annotations

import pytest

from rollmesh.mesh.errors import ConfigError
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.deployment import engine_kwargs
from rollmesh.serving.deployment import replica_env


def test_from_env_reads_serving_variables_and_overrides_win() -> None:
    env = {
        "ROLLMESH_REPLICAS": "3",
        "ROLLMESH_RAY_ADDRESS": "auto",
        "ROLLMESH_REPLICA_CPUS": "0.5",
        "ROLLMESH_VLLM_KVCACHE_GIB": "2",
        "ROLLMESH_VLLM_MAX_MODEL_LEN": "128",
    }
    cfg = ServingConfig.from_env("/models/tiny-arith", environ=env, replicas=None)
    assert (cfg.replicas, cfg.ray_address, cfg.replica_cpus, cfg.kvcache_gib) == (3, "auto", 0.5, 2)
    assert cfg.name == "tiny-arith" and cfg.device == "cpu" and cfg.max_model_len == 128
    assert ServingConfig.from_env("/m", environ=env, replicas=1).replicas == 1


def test_defaults_when_unset() -> None:
    cfg = ServingConfig.from_env("/m/x", model_name="named", environ={})
    assert (cfg.replicas, cfg.replica_gpus, cfg.tensor_parallel_size, cfg.ray_address) == (1, 0.0, 1, "")
    assert cfg.name == "named"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"ROLLMESH_REPLICAS": "0"}, "ROLLMESH_REPLICAS"),
        ({"ROLLMESH_REPLICAS": "two"}, "ROLLMESH_REPLICAS"),
        ({"ROLLMESH_TP_SIZE": "2", "ROLLMESH_REPLICA_GPUS": "1"}, "ROLLMESH_TP_SIZE"),
        ({"ROLLMESH_VLLM_KVCACHE_GIB": "0"}, "ROLLMESH_VLLM_KVCACHE_GIB"),
    ],
)
def test_bad_values_fail_fast_naming_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ServingConfig.from_env("/m", environ=env)


def test_cpu_replica_gets_threads_and_kv_cache_gpu_replica_gets_tp() -> None:
    cpu = ServingConfig(model_path="/m", replica_cpus=2, kvcache_gib=3)
    assert replica_env(cpu) == {
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "2",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the one worker runs in the engine core process
    }
    assert "gpu_memory_utilization" not in engine_kwargs(cpu)
    assert engine_kwargs(cpu)["enforce_eager"] is True  # no inductor compile at load on CPU
    gpu = ServingConfig(model_path="/m", replica_gpus=2, tensor_parallel_size=2, max_model_len=512)
    kwargs = engine_kwargs(gpu)
    assert gpu.device == "cuda"
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "mp"
    assert kwargs["max_model_len"] == 512
    assert "enforce_eager" not in kwargs and "VLLM_ENABLE_V1_MULTIPROCESSING" not in replica_env(gpu)


def test_app_name_is_unique_per_gateway_unless_given() -> None:
    a = ServingConfig.from_env("/m/tiny-arith", environ={})
    b = ServingConfig.from_env("/m/tiny-arith", environ={})
    assert a.app_name.startswith("rollmesh-tiny-arith-") and a.app_name != b.app_name
    named = ServingConfig.from_env("/m/x", environ={"ROLLMESH_SERVE_APP_NAME": "team-a"})
    assert named.app_name == "team-a"
    with pytest.raises(ConfigError, match="ROLLMESH_SERVE_APP_NAME"):
        ServingConfig.from_env("/m/x", environ={"ROLLMESH_SERVE_APP_NAME": "a#b"})


def test_placement_and_engine() -> None:
    cfg = ServingConfig.from_env(
        "/m", environ={"ROLLMESH_REPLICAS_PER_NODE": "1", "ROLLMESH_SERVE_ENGINE": "fake"}
    )
    assert (cfg.replicas_per_node, cfg.engine) == (1, "fake")
    with pytest.raises(ConfigError, match="ROLLMESH_SERVE_ENGINE"):
        ServingConfig.from_env("/m", environ={"ROLLMESH_SERVE_ENGINE": "tpu"})


def test_build_app_places_and_picks_the_replica_class() -> None:
    from rollmesh.serving.deployment import VLLMReplica
    from rollmesh.serving.deployment import build_app
    from rollmesh.serving.fake_replica import FakeReplica

    spread = build_app(ServingConfig(model_path="/m", replicas=3, replicas_per_node=1, engine="fake"))
    deployment = spread._bound_deployment
    assert deployment.func_or_class is FakeReplica and deployment.num_replicas == 3
    assert deployment._replica_config.max_replicas_per_node == 1
    anywhere = build_app(ServingConfig(model_path="/m"))._bound_deployment
    assert anywhere.func_or_class is VLLMReplica and anywhere._replica_config.max_replicas_per_node is None


_STOP_OWN_RAY_PROBE = """
import os, subprocess, sys
import ray
from rollmesh.serving.cluster import _stop_own_ray_processes

ray_program = os.path.join(os.path.dirname(ray.__file__), "_private", "log_monitor.py")
sleeper = "import time; time.sleep(120)"
like_ray = subprocess.Popen([sys.executable, "-c", sleeper, ray_program])
other = subprocess.Popen([sys.executable, "-c", sleeper, "not-ray"])
try:
    killed = _stop_own_ray_processes()
    like_ray_code = like_ray.wait(timeout=30)
    print(killed, like_ray_code, other.poll())
finally:
    for proc in (like_ray, other):
        proc.kill()
        proc.wait(timeout=30)
"""


def test_a_failed_ray_start_leaves_no_ray_process_of_ours_behind() -> None:
    """Ray forgets a node whose start timed out; its GCS, monitors and dashboard keep running unless
    the retry loop kills them. Only this process's children running Ray's programs are killed.

    Run in a fresh process: this test process may be a Ray driver (earlier tests' local cluster),
    whose own Ray children the probe would rightly count and kill."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _STOP_OWN_RAY_PROBE], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    killed, like_ray_code, other_status = out.stdout.split()
    assert killed == "1"  # the Ray-like child only
    assert like_ray_code != "0"  # it was killed, not left to finish
    assert other_status == "None"  # the other child still ran


def test_whole_outputs_skip_vllms_detokenizer_unless_stop_strings_need_it() -> None:
    from rollmesh.gateway.backends.base import Sampling
    from rollmesh.serving.deployment import _sampling_params

    assert _sampling_params(Sampling(logprobs=True), deltas=False).detokenize is False
    assert _sampling_params(Sampling(stop=("\n",)), deltas=False).detokenize is True
    assert _sampling_params(Sampling(), deltas=True).detokenize is True  # streamed text deltas
