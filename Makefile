# boundserve — two entry points for a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/demo.toml
MODEL  ?=
PORT   ?= 8000
# The artifacts folder is named after the model folder, so two checkpoints never share one.
NAME      ?= $(if $(MODEL),$(notdir $(abspath $(MODEL))),demo)
ARTIFACTS ?= artifacts/$(NAME)
DEMO_MODEL := models/demo
SERVE_MODEL = $(if $(MODEL),$(MODEL),$(DEMO_MODEL))

.PHONY: serve test venv compile demo-model bench bench-venv bench-build bench-serving compose-check clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

$(DEMO_MODEL)/config.json: | venv
	$(PY) -m compile.demo --out $(DEMO_MODEL)

demo-model: $(DEMO_MODEL)/config.json

compile: venv $(if $(MODEL),,$(DEMO_MODEL)/config.json)
	$(PY) -m compile --model $(SERVE_MODEL) --config $(CONFIG) --out $(ARTIFACTS)

serve: compile
	$(PY) -m gateway --config $(CONFIG) --artifacts $(ARTIFACTS) --spawn-workers --port $(PORT)

# One pytest process per core of a 2-core machine (pytest-xdist): the suite's main cost is compiling its
# tiny deployments, one Python thread and one g++ at a time each, so the processes first share those
# builds out, longest first, then the tests (tests/builds.py). TEST_PROCS=0: one process.
TEST_PROCS ?= 2

test: venv
	$(PY) -m pytest -n $(TEST_PROCS)

# Benchmarks need the peer engines (CTranslate2, OpenVINO), which `make test` never installs.
bench-venv: $(VENV)/.bench-installed

$(VENV)/.bench-installed: $(VENV)/.installed
	$(VENV)/bin/pip install -q -e '.[test,bench]'
	touch $@

# The headline set: full-depth scoring (Qwen2.5-0.5B 24 layers, Qwen3-0.6B 28 layers; fp32, bf16 and
# int8, each against transformers and CTranslate2, fp32 and bf16 against OpenVINO, int8 against our bf16) and beam search (Qwen2.5-0.5B, W=100, S=4, 256-token prompts;
# our node in fp32, bf16 and int8, batch sizes that would not fit in memory skipped and named), each against transformers
# and CTranslate2 in the same run; and shared-prefix scoring (one context x 15 items, Qwen2.5-0.5B
# 24 layers, fp32 and bf16) against the unshared node and transformers; then where the time goes
# (operator families and every GEMM shape against the peak, fp32, bf16 and int8). Results land in
# bench/results/. Run it from one commit on a quiet machine; `make bench-build` first does the
# compiling (cached in bench/.cache), so that the timed runs are all `make bench` does.
SCORE_REQUESTS ?= 2
# INT8_BUDGET=0.5: the int8 runs select layers under that many nats (gate loosened to match) instead of
# [quantize]'s defaults (--int8-budget of every int8 run: score_node, beam_node, shared_prefix, profile_nodes)
INT8_BUDGET ?=
INT8_BUDGET_ARG = $(if $(INT8_BUDGET),--int8-budget $(INT8_BUDGET))
# The int8 runs include OpenVINO, so that one run times int8, our float node and every peer; with every engine in
# one process a 24-layer run needs most of a 24 GiB machine. INT8_EXTRA=--no-openvino leaves it out on a smaller one.
INT8_EXTRA ?=
INT8_ARGS = $(INT8_BUDGET_ARG) $(INT8_EXTRA)
SCORE := $(PY) bench/score_node.py
BEAM  := $(PY) bench/beam_node.py

bench-build: bench-venv
	$(SCORE) --model qwen2.5-0.5b --dtype fp32 --build-only
	$(SCORE) --model qwen2.5-0.5b --dtype bf16 --build-only
	$(SCORE) --model qwen3-0.6b --dtype fp32 --build-only
	$(SCORE) --model qwen3-0.6b --dtype bf16 --build-only
	$(SCORE) --model qwen2.5-0.5b --dtype int8 $(INT8_ARGS) --build-only
	$(SCORE) --model qwen3-0.6b --dtype int8 $(INT8_ARGS) --build-only
	$(BEAM) --model qwen2.5-0.5b --bf16 --int8 $(INT8_BUDGET_ARG) --build-only

bench: bench-build
	$(SCORE) --model qwen2.5-0.5b --dtype fp32 --requests $(SCORE_REQUESTS)
	$(SCORE) --model qwen2.5-0.5b --dtype bf16 --requests $(SCORE_REQUESTS)
	$(SCORE) --model qwen3-0.6b --dtype fp32 --requests $(SCORE_REQUESTS)
	$(SCORE) --model qwen3-0.6b --dtype bf16 --requests $(SCORE_REQUESTS)
	$(SCORE) --model qwen2.5-0.5b --dtype int8 $(INT8_ARGS) --requests $(SCORE_REQUESTS)
	$(SCORE) --model qwen3-0.6b --dtype int8 $(INT8_ARGS) --requests $(SCORE_REQUESTS)
	$(BEAM) --model qwen2.5-0.5b --bf16 --int8 $(INT8_BUDGET_ARG)
	$(PY) bench/shared_prefix.py --model qwen2.5-0.5b --dtype fp32
	$(PY) bench/shared_prefix.py --model qwen2.5-0.5b --dtype bf16
	$(PY) bench/shared_prefix.py --model qwen2.5-0.5b --dtype int8 $(INT8_BUDGET_ARG)
	$(PY) bench/profile_nodes.py --model qwen2.5-0.5b --dtype fp32
	$(PY) bench/profile_nodes.py --model qwen2.5-0.5b --dtype bf16
	$(PY) bench/profile_nodes.py --model qwen2.5-0.5b --dtype int8 $(INT8_BUDGET_ARG)

# Serving-path benchmarks on the tiny demo model (the CPU's share of a request outside the model).
bench-serving: bench-venv
	$(PY) bench/protocol.py
	$(PY) bench/gateway_overhead.py
	$(PY) bench/overload.py

# docker-compose.yml built and run for real (docs/deployment.md): installs Docker and a Compose client
# from Debian if missing (root), starts a daemon if none answers, builds every image (a Debian-built
# base and docker/wheels where registries are out of reach), serves both routes from containers,
# checks Prometheus, and `down`s. Not part of `make test`: it takes minutes. COMPOSE_CHECK_ARGS: --help.
COMPOSE_CHECK_ARGS ?=

compose-check: venv
	$(PY) -m deploy.compose_check $(COMPOSE_CHECK_ARGS)

clean:
	rm -rf artifacts models .pytest_cache
