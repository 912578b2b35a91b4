# make serve      - install what is needed (first run) and serve the default model with tritonserver
# make test       - install the test dependencies and run the whole CPU test suite
# make test-gpu   - the GPU suite (tests/gpu) on a CUDA host
# make client-cli - rose-embed's Parquet and progress-bar extras in the same environment
# make help       - this text
# Variables: MODEL=<HF folder>  KIND=auto|embedding|cross-encoder|qwen3-reranker  GRPC_PORT=8001 HTTP_PORT=8000 METRICS_PORT=8002  ADDRESS=127.0.0.1
#            RERANKER=<reranker folder> (served as `rerank` beside MODEL's `embed`, in one server; KIND is MODEL's)
#            GATEWAY_PORT=8080 (the OpenAI-compatible HTTP gateway; GATEWAY=0 leaves it out)
#            REPLICAS=1  GPUS=0,1 (one server per GPU)  PY=python3  VENV=.venv
#            STUB_DEATH_WINDOW=60 (a server whose Python stub died is restarted; another death this soon stops serve)
#            TRUST_REMOTE_CODE=1 (run a folder's own modeling code, config.json's auto_map: docs/MODELS.md; off by default)
#            ROSE_CACHE_DIR=~/.cache/rose (persistent compile caches: flashinfer JIT, Triton kernels)
# Keys, from the environment (`API_KEY=... make serve`) or a file (API_KEY_FILE=path), never make's
# command line, which process listings show: API_KEY requires a key on Triton's inference and
# metadata and the gateway's /v1/*; ADMIN_KEY is Triton's control-plane key (default: random per start).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
GRPC_PORT ?= 8001
HTTP_PORT ?= 8000
METRICS_PORT ?= 8002
GATEWAY ?= 1
API_KEY_FILE ?=
GATEWAY_PORT ?= 8080
ADDRESS ?= 127.0.0.1
REPLICAS ?= 1
MODEL ?=
RERANKER ?=
KIND ?=
GPUS ?=
PYTEST_ARGS ?=
ROSE_CACHE_DIR ?= $(HOME)/.cache/rose

.PHONY: help serve test test-gpu install client-cli clean

help:
	@sed -n '1,/^[^#]/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

ifeq ($(origin API_KEY),command line)
$(warning API_KEY on make's command line shows in process listings (ps shows make's arguments): use `API_KEY=... make serve` or API_KEY_FILE=path)
endif
ifeq ($(origin ADMIN_KEY),command line)
$(warning ADMIN_KEY on make's command line shows in process listings: use `ADMIN_KEY=... make serve`)
endif

install: $(VENV)/.installed

# torch: reuse the interpreter's own (NGC image, GPU hosts) through system site-packages;
# otherwise install the pinned CPU build. nvidia-pytriton only for its bundled tritonserver.
$(VENV)/.installed: pyproject.toml client/pyproject.toml
	@if $(PY) -c "import torch" 2>/dev/null; then $(PY) -m venv --system-site-packages $(VENV); \
	 else $(PY) -m venv $(VENV); fi
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e .   # the server side, the HTTP gateway and the client (rose-embed)
	@command -v tritonserver >/dev/null || [ -n "$$TRITONSERVER_BIN" ] || \
	  $(BIN)/python -m pip install -q --no-deps nvidia-pytriton==0.7.0
	@touch $@

# rose-embed's Parquet input and output and its progress bar (the `cli` extra), in the same environment
client-cli: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[cli]"

$(VENV)/.test-installed: $(VENV)/.installed benchmarks/pyproject.toml
	$(BIN)/python -m pip install -q -e ".[test,cli]"
	$(BIN)/python -m pip install -q -e ./benchmarks   # rose_bench (benchmarks/pyproject.toml), not in the product's wheel
	@touch $@

# exec: the launcher's parent is make itself, so killing make (even SIGKILL) stops the servers.
# API_KEY / ADMIN_KEY reach the launcher through the environment (never this recipe's text).
serve: install
	ROSE_CACHE_DIR="$(ROSE_CACHE_DIR)" exec $(BIN)/python -m rose_backend.launch --grpc-port $(GRPC_PORT) --http-port $(HTTP_PORT) \
	  --metrics-port $(METRICS_PORT) --address $(ADDRESS) --replicas $(REPLICAS) \
	  --gateway-port $(if $(filter 0,$(GATEWAY)),0,$(GATEWAY_PORT)) \
	  $(if $(MODEL),--model "$(MODEL)") $(if $(RERANKER),--reranker "$(RERANKER)") $(if $(KIND),--kind "$(KIND)") \
	  $(if $(GPUS),--gpus "$(GPUS)") $(if $(STUB_DEATH_WINDOW),--stub-death-window "$(STUB_DEATH_WINDOW)") \
	  $(if $(API_KEY_FILE),--api-key-file "$(API_KEY_FILE)") \
	  $(if $(filter 1 true yes on,$(TRUST_REMOTE_CODE)),--trust-remote-code)

# Three pytest-xdist workers on the 2-core machine (tests/conftest.py keeps each module on one
# worker): much of a server test is waiting on a server's start-up and shutdown, or on a timeout it
# checks, which the others fill. No test needs the machine to itself (how fast is the benchmarks'
# question). Four workers were no faster here (312 s against 316 s) and loaded the host
# past 13, where Triton's Python backend aborts more often as it starts.
# Bytecode caching on even where the environment turns it off (PYTHONDONTWRITEBYTECODE, as in many
# container images): the workers, launchers, gateways and tools otherwise compile the project's
# modules (and pytest rewrites the test modules) anew in every process.
test: $(VENV)/.test-installed
	PYTHONDONTWRITEBYTECODE= HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow" -n 3 $(PYTEST_ARGS)

# The GPU suite (run on a CUDA host; CI has none and skips it).
test-gpu: $(VENV)/.test-installed
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests/gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
