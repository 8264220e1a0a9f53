# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format install clean gpu-rehearse

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the tested CPU build, exactly; pyproject.toml itself asks only for torch>=2.9,<3
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,skypilot,wandb,mlflow]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/nightlab demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

# .ci/install-test-deps installs the Debian packages the tests need when run as root; the run then
# says, before the first test, what is still missing and what it costs (tests/needs.py).
# `make test` runs two pytest-xdist workers, each taking whole files (a file's tests share their
# module fixtures and run in order), the slowest files first (tests/scheduling.py SLOW_FIRST;
# tests/skypilot_real is one unit on one worker, its services in a background cgroup weighing one
# process: `in_the_background`): ~16 min of tests on the 2-core box against ~26 serially
# (bench/RESULTS.md 2026-12-05). `make test TEST_WORKERS=0` runs them in one process, in file order.
TEST_WORKERS ?= 2
test: $(STAMP) lint
	bash .ci/install-test-deps
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) nightlab-demo .gpu-rehearse

# Dress rehearsal of bench/gpu_check.sh on CPU: venvs holding only the GPU image's packages (see
# bench/gpu_rehearse.sh), so an import or version problem shows up here, not on a lent GPU.
gpu-rehearse: $(STAMP)
	bash bench/gpu_rehearse.sh
