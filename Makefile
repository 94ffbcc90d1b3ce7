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

.PHONY: serve test venv compile demo-model bench clean

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

test: venv
	$(PY) -m pytest

clean:
	rm -rf artifacts models .pytest_cache
