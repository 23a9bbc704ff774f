# rollmesh: `make run` (set up + the main job), `make test` (set up + every check and test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Extra pip options, e.g. PIP_EXTRA="--extra-index-url <PyTorch CPU index>" on machines
# where the CPU build of torch is not on pip's find-links.
PIP_EXTRA ?=

.PHONY: sysdeps nemo-gym-venv nemo-gym-0.7-python foreign-venvs setup run train-demo test pytest test-containers lint typecheck docs protos protos-check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_EXTRA) -c requirements.lock -e ".[serve,dev,trainers]"
	# PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break transformers.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

run: setup
	$(BIN)/rollmesh run --benchmark arithmetic

# Online GRPO on the tiny model through the mesh (examples/grpo_arith.py; 80 steps, ~9 min on 2 loaded CPU cores).
train-demo: setup
	$(BIN)/python examples/grpo_arith.py --embedded --out runs/grpo_arith

protos: setup
	$(BIN)/python scripts/gen_protos.py

protos-check: setup
	$(BIN)/python scripts/gen_protos.py --check

lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy services clients/python/rollmesh_client scripts bench

# The documentation site (mkdocs.yml, docs/): a broken link or anchor between pages fails it.
docs: setup
	$(BIN)/python scripts/gen_cli_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# `make test`: the checks, the foreign virtualenvs the tests use and pytest all at once (make -j: they
# share nothing; a test needing a venv still being built waits on its lock). pytest runs on
# TEST_WORKERS pytest-xdist workers (twice the cores: most tests wait on the servers they start),
# each test file on one worker, the real-vLLM tests one after another (tests/parallel.py).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))
test: setup sysdeps
	$(MAKE) --no-print-directory -j8 protos-check lint typecheck docs foreign-venvs pytest

pytest: setup
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# Debian packages tests use: Prometheus (tests/e2e/test_prometheus_scrape.py scrapes the mesh with it)
# and tmux (tests/e2e/test_run_terminal.py reads `make run`'s screen in a real terminal), debootstrap (the
# container tasks' local base image, made once: docs/container-tasks.md; the Debian root NeMo Gym
# 0.7.0's interpreter comes from, scripts/debian_root.py); installed with apt-get when missing (as
# root, else through sudo), so `make test` needs nothing installed by hand.
SYSDEPS := prometheus tmux debootstrap
sysdeps:
	@missing=$$(for tool in $(SYSDEPS); do command -v $$tool >/dev/null || echo $$tool; done); \
	if [ -n "$$missing" ]; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  echo "sysdeps: installing $$missing (apt-get)"; \
	  $$sudo apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	fi

# The virtualenvs the bridges' tests run foreign code in: NeMo Gym 0.4.0's and 0.7.0's servers
# (scripts/nemo_gym.py), verifiers 0.3.1 and 0.4.0 (scripts/verifiers_venv.py), OpenEnv's openenv-core
# 0.3.0 and openenv 0.10.0 with TRL (scripts/openenv_venv.py; ~3 minutes each cold); built once, at once,
# and cached under ~/.cache/rollmesh (seconds when warm). NeMo Gym 0.7.0 needs Python >= 3.13.14,
# which neither pyenv nor Debian stable has: as root its venv is made with Debian forky's python3.13,
# from a root debootstrapped once into ~/.cache/rollmesh/python (scripts/debian_root.py; minutes).
# Exit 3 is "no such Python on this machine": the tests that need it then skip, naming that.
FOREIGN_VENVS := nemo-gym-0.4.0 nemo-gym-0.7.0 verifiers-0.3.1 verifiers-0.4.0 openenv-core-0.3.0 openenv-0.10.0
.PHONY: $(FOREIGN_VENVS)
foreign-venvs: $(FOREIGN_VENVS)
nemo-gym-venv: nemo-gym-0.4.0 nemo-gym-0.7.0
$(filter nemo-gym-%,$(FOREIGN_VENVS)): nemo-gym-%: setup
	$(BIN)/python scripts/nemo_gym.py venv --version $* >/dev/null || [ $$? = 3 ]
$(filter verifiers-%,$(FOREIGN_VENVS)): verifiers-%: setup
	$(BIN)/python scripts/verifiers_venv.py --version $* >/dev/null || [ $$? = 3 ]
openenv-core-0.3.0: setup
	$(BIN)/python scripts/openenv_venv.py --dist openenv-core --version 0.3.0 >/dev/null || [ $$? = 3 ]
openenv-0.10.0: setup
	$(BIN)/python scripts/openenv_venv.py --dist openenv --version 0.10.0 --trl >/dev/null || [ $$? = 3 ]

# The interpreter NeMo Gym 0.5-0.7 needs, alone: the Debian forky root's as root (as above), else
# CPython built from Debian's python3.13 source package into ~/.cache/rollmesh/python (15-50 minutes).
nemo-gym-0.7-python: setup
	$(BIN)/python scripts/nemo_gym.py python --version 0.7.0

# The container stack for real (docs/containers.md): deploy/local-docker.sh makes
# Docker usable where there is none (daemon, compose, base image; cached), then
# tests/e2e/test_deploy_stack.py builds, starts, uses and tears down the stack, within
# STACK_TEST_TIMEOUT seconds in all; no test stack is left running (deploy/test-containers.sh).
STACK_TEST_TIMEOUT ?= 3000
test-containers: setup
	STACK_TEST_TIMEOUT=$(STACK_TEST_TIMEOUT) deploy/test-containers.sh $(BIN)/python

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
