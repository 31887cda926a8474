# minitfm: `make train` trains the default config, `make test` runs the tests.
# Both install first (once): a virtual environment in .venv with the pinned torch.

PYTHON ?= python3
VENV   ?= .venv
# Installed before the package so pip never resolves a bare `torch` (a several-GB CUDA build).
# Override for another build, e.g. `make install TORCH="torch==2.13.0 --index-url <your index>"`.
TORCH  ?= torch==2.13.0
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
CONFIG ?=
ARGS   ?=
# The package's extras to install; CI adds bench (x-transformers), ray, mlflow, frame
# (pandas) and search (Optuna): `make install EXTRAS=dev,bench,ray,mlflow,frame,search`.
EXTRAS ?= dev
PORT   ?= 6006

.PHONY: install train test test-fast test-book lint bench tensorboard notebook figures data clean FORCE

install: $(STAMP)

# Re-runs only when pyproject.toml or the torch pin changes, so a second `make` is quick:
# the stamp holds the pin it was made with, and another pin forces the rule.
PINNED := $(shell cat $(STAMP) 2>/dev/null)
$(STAMP): pyproject.toml $(if $(subst $(TORCH),,$(PINNED))$(subst $(PINNED),,$(TORCH)),FORCE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	echo "$(TORCH)" > $(STAMP)

train: install
	$(BIN)/minitfm train $(CONFIG) $(ARGS)

# The tests in a process per core (pytest-xdist; each test pins torch to 1 thread), at most 8, a
# module's tests in one process (its shared fixtures made once).
# Python's bytecode is kept between runs (as Python's default is; an environment that turns it off
# makes every process compile minitfm and the tests anew: 3 s more to collect them, each worker).
PARALLEL = -n auto --maxprocesses=8 --dist loadscope
PYTEST   = env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q $(PARALLEL)

test: install
	$(PYTEST) $(ARGS)

# The tests not marked slow (none trains past ~50 steps or starts other torch processes).
test-fast: install
	$(PYTEST) -m "not slow" $(ARGS)

# The book's own tests (tests/book/): each chapter against PyTorch, in seconds.
test-book: install
	$(BIN)/python -m pytest -q tests/book $(ARGS)

lint: install
	$(BIN)/ruff check minitfm tests

bench: install
	$(BIN)/minitfm bench $(ARGS)

tensorboard: install
	$(BIN)/tensorboard --logdir runs --port $(PORT) --samples_per_plugin images=100

# Runs notebooks/tour.ipynb from top to bottom and writes it back with its outputs (it ships
# executed, pictures included; tests/test_notebook.py checks they belong to its code, and warns
# when the package changed since). Its kernel gets 2 threads, so a second run on the same
# machine gives the same numbers. The run goes to runs/.
notebook: install
	$(BIN)/python notebooks/execute.py

# Remakes every figure of docs/ that a command makes, on an idle machine, after a change of the
# default: the default run's pictures (docs/over-training-reverse.png, docs/ablate-reverse.png),
# the shipped configs' runs, the lengthgen sweep (docs/lengthgen.png: 18 runs, most of the time),
# grokking's run and its phases (docs/grokking.png) and the notebook (as `make notebook`); their
# numbers go to docs/figures.json, which tests/test_docs.py holds the docs to. Runs go to runs/figures/. One step:
# `make figures ARGS="--only default"` (steps: default, configs, lengthgen, grokking, notebook).
figures: install data
	$(BIN)/python docs/make_figures.py $(ARGS)

# The example data of configs/dates.yaml (seeded; standard library only, so no install).
data:
	$(PYTHON) examples/dates/make_data.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

FORCE:
