#!/bin/sh
# Join the Ray cluster at $RAY_HEAD_ADDRESS as a node that offers no CPUs or GPUs (so no replica is
# placed here), then exec the given command. The gateway uses it: it is the Ray Serve driver, and with
# ROLLMESH_RAY_ADDRESS=auto it talks to the cluster through this node's raylet, while the vLLM
# replicas run on the head (CPU) or on the GPU workers of the `gpu` profile.
# A cluster with token auth (Ray 2.60's default when a token exists): give this container the head's
# token (~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); `ray start` then joins with it,
# and the gateway (serving/join.py) turns RAY_AUTH_MODE=token on for itself.
set -eu

: "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS to the Ray head host:port, e.g. ray-head:6379}"

ray start \
  --address="$RAY_HEAD_ADDRESS" \
  --num-cpus=0 \
  --num-gpus=0 \
  --object-store-memory="${RAY_OBJECT_STORE_BYTES:-100000000}" \
  --disable-usage-stats

exec "$@"
