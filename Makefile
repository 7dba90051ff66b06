# The two commands of the README: `make demo` (set up + start the app), `make test` (set up + tests).
.PHONY: setup setup-dev demo test

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh dev

demo: setup
	.venv/bin/python app.py $(ARGS)

test: setup-dev
	.venv/bin/python -m pytest -v
