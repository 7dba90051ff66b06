# The two commands of the README: `make demo` (set up + start the app), `make test` (set up, lint, tests).
.PHONY: setup setup-dev demo notebooks lint test

setup:
	bash scripts/setup.sh

setup-dev:
	bash scripts/setup.sh dev

demo: setup
	.venv/bin/python app.py $(ARGS)

# Jupyter joins .venv on first use (kept to the verified CPU stack's pins there), then opens the guided notebooks.
notebooks: setup
	@[ -x .venv/bin/jupyter ] || .venv/bin/pip install -q jupyterlab $$(command -v nvidia-smi >/dev/null || echo -c constraints-cpu.txt)
	.venv/bin/jupyter lab notebooks/ $(ARGS)

lint: setup-dev
	.venv/bin/ruff check .

# The tests whose limits are times (browser time-outs, the app's 5-s stop) run after the rest, away from its load,
# in two workers of their own: the two browser files, one each (each serves its own app), then the app's. The rest
# runs in two workers before them (tests/conftest.py says how and why).
TIMED = tests/test_ui.py tests/test_ui_tabs.py tests/test_app.py
XDIST = -n 2 --dist loadfile --no-loadscope-reorder

test: lint
	.venv/bin/python -m pytest -v $(XDIST) $(addprefix --ignore=,$(TIMED))
	.venv/bin/python -m pytest -v $(XDIST) $(TIMED)
