"""The notebooks tests/test_notebooks.py leaves to this file (its HALF says which), with its checks and its kind of
shared sessions: a file of their own, so that CI's two workers each run half of them."""

import pytest

from tests.test_notebooks import check_notebook, notebooks, shared_sessions

_shared = pytest.fixture(scope="module", name="shared")(shared_sessions)


@pytest.mark.slow
@pytest.mark.parametrize("path", notebooks(first_half=False), ids=lambda p: p.name)
def test_notebook_runs_and_every_answer_is_computed(path, capfd, shared, monkeypatch):
    check_notebook(path, capfd, shared, monkeypatch)
