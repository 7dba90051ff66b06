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

# The tests whose limits are times (browser time-outs, the app's 5-s stop) run alone, after the rest; the rest
# runs in two workers (tests/conftest.py says how and why).
ALONE = tests/test_ui.py tests/test_app.py

test: lint
	.venv/bin/python -m pytest -v -n 2 --dist loadfile --no-loadscope-reorder $(addprefix --ignore=,$(ALONE))
	.venv/bin/python -m pytest -v $(ALONE)
