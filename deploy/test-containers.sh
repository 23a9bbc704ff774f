#!/usr/bin/env bash
# `make test-containers`: the container stack test, bounded, on any machine this project runs on.
#
#   deploy/test-containers.sh [PYTHON]        # PYTHON: the venv's python (default .venv/bin/python)
#
# 1. deploy/local-docker.sh makes Docker usable where there is none (daemon, compose, base image;
#    all cached) and its exports (DOCKER_HOST, BASE_IMAGE, ROLLMESH_COMPOSE) are taken over.
# 2. tests/e2e/test_deploy_stack.py builds, starts, uses and tears down the compose stack, within
#    STACK_TEST_TIMEOUT seconds in all (default 3000): half of it at most for the image build
#    (cached after the first run), a third for `up` and the health of every container.
#    tests/e2e/test_container_tasks_docker.py runs the container tasks (docs/container-tasks.md) on
#    the Docker provider; testcontainers' reaper (Ryuk, a Docker Hub image) is disabled.
# 3. Whatever happens, no test stack is left running (projects named rollmesh-e2e-*: containers,
#    networks, volumes), nor a container task's machine (label rollmesh.machine=1: containers, and
#    the networks of compose services beside one), and dangling
#    images of rebuilt layers are pruned. Cached layers stay.
# Exit status: pytest's (124 when the time ran out), or the failing step's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-.venv/bin/python}"
BUDGET="${STACK_TEST_TIMEOUT:-3000}"

exports="$(deploy/local-docker.sh)"
eval "$exports"

leftovers() {
  local kind="$1" format="$2"
  timeout 60 docker "$kind" ls ${3:-} --format "$format" 2>/dev/null | awk '$2 ~ /^rollmesh-e2e-/ {print $1}'
}

cleanup() {
  local ids
  ids="$(leftovers container '{{.ID}} {{.Label "com.docker.compose.project"}}' -a || true)"
  [ -n "$ids" ] && timeout 300 docker rm -f -v $ids >/dev/null 2>&1 || true
  ids="$(leftovers network '{{.ID}} {{.Label "com.docker.compose.project"}}' || true)"
  [ -n "$ids" ] && timeout 120 docker network rm $ids >/dev/null 2>&1 || true
  ids="$(leftovers volume '{{.Name}} {{.Label "com.docker.compose.project"}}' || true)"
  [ -n "$ids" ] && timeout 120 docker volume rm $ids >/dev/null 2>&1 || true
  ids="$(timeout 60 docker ps -aq --filter label=rollmesh.machine=1 2>/dev/null || true)"
  [ -n "$ids" ] && timeout 300 docker rm -f -v $ids >/dev/null 2>&1 || true
  ids="$(timeout 60 docker network ls -q --filter label=rollmesh.machine=1 2>/dev/null || true)"
  [ -n "$ids" ] && timeout 120 docker network rm $ids >/dev/null 2>&1 || true
  timeout 300 docker image prune -f >/dev/null 2>&1 || true
}
trap cleanup EXIT

export ROLLMESH_STACK_BUILD_TIMEOUT_S=$((BUDGET / 2))
export ROLLMESH_STACK_UP_TIMEOUT_S=$((BUDGET / 3))
export TESTCONTAINERS_RYUK_DISABLED=true
timeout --kill-after=60 "$BUDGET" \
  "$PYTHON" -m pytest -q -ra -p no:cacheprovider tests/e2e/test_deploy_stack.py tests/e2e/test_container_tasks_docker.py
