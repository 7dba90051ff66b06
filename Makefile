# The two commands of the README: `make demo` (set up + start the app), `make test` (set up, lint, tests).
.PHONY: setup setup-dev demo lint test

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh dev

demo: setup
	.venv/bin/python app.py $(ARGS)

lint: setup-dev
	.venv/bin/ruff check .

test: lint
	.venv/bin/python -m pytest -v -n 2 --dist loadfile --no-loadscope-reorder
