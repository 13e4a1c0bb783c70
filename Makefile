# Each target bootstraps first (scripts/bootstrap is idempotent and fast when done).
VENV := .venv
BOOT := $(VENV)/.bootstrap-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run chat test bench lint

$(BOOT): pyproject.toml scripts/bootstrap
	scripts/bootstrap

# `make run` serves the gateway on http://127.0.0.1:8000 (embedded Redis Stack, bundled
# model and embedder); `make chat` talks to the model in the terminal.
run: $(BOOT)
	$(VENV)/bin/semgate serve

chat: $(BOOT)
	$(VENV)/bin/semgate chat $(if $(PROMPT),"$(PROMPT)")

test: $(BOOT)
	$(VENV)/bin/pytest -q

bench: $(BOOT)
	$(VENV)/bin/semgate bench engine
	$(VENV)/bin/semgate bench spec
	$(VENV)/bin/semgate bench quality
	$(VENV)/bin/semgate bench quant
	$(VENV)/bin/semgate bench cache
	$(VENV)/bin/semgate bench gateway
	$(VENV)/bin/semgate bench faults

lint: $(BOOT)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
