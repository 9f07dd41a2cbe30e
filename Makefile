# Quick start: `make playground` starts the app on the default models; `make test` runs the tests.
.PHONY: setup playground test test-fast

setup:
	@bash scripts/setup.sh

playground: setup
	.venv/bin/python app.py

test: setup
	.venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist worksteal --durations=30

test-fast: setup
	.venv/bin/python -m pytest -q -n auto --maxprocesses 4 -m "not slow and not browser"
