# Fresh machine: `make demo` runs the main job, `make test` passes the tests. Both set up the venv.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned here, not in the package: 2.13.0 is the CPU wheel this machine carries
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,parity,dist,plot,render,genai,explorer]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/graphllm trace --config examples/llama.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# one worker a core (pytest-xdist): the suite takes about half the time on two cores
test: $(STAMP) lint
	$(PY) -m pytest -q -n auto

bench: $(STAMP)
	$(PY) benchmarks/trace_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
