# Each target bootstraps first (scripts/bootstrap is idempotent and fast when done).
VENV := .venv
BOOT := $(VENV)/.bootstrap-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test bench lint

$(BOOT): pyproject.toml scripts/bootstrap
	scripts/bootstrap

# `make run` opens a chat REPL; `make run PROMPT="..."` answers one prompt.
run: $(BOOT)
	$(VENV)/bin/semgate chat $(if $(PROMPT),"$(PROMPT)")

test: $(BOOT)
	$(VENV)/bin/pytest -q

bench: $(BOOT)
	$(VENV)/bin/semgate bench engine
	$(VENV)/bin/semgate bench cache

lint: $(BOOT)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
