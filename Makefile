# Two commands set everything up on a fresh machine (Python 3.11 with venv):
#   make run   - virtual environment, pinned requirements, migrations, demo knowledge base,
#                then the app on the embedded default at http://127.0.0.1:8000/
#   make test  - the same environment plus test requirements, then the whole suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test install install-dev migrate bench replay clean

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

run: migrate
	$(BIN)/python manage.py load_demo_kb
	$(BIN)/daphne -b $(HOST) -p $(PORT) chatapp.asgi:application

test: install-dev
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/memory_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .test-db.sqlite3*
