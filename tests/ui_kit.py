"""What the browser tests share (tests/test_ui.py, tests/test_ui_tabs.py): the served app with the real engines (CPU),
headless Chromium, the workshop room's token, and the waits and form fills a person's page needs. Each test file that
asks for ``served`` gets an app of its own (module scope), so that the two files can run in two processes.
tests/conftest.py makes the fixtures here visible to every test file."""

from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from lab.app.host_process import RemoteHost
from lab.config import EngineConfig
from lab.serve import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def access():
    """The served app's presenter and endpoint rules: 127.0.0.1, no token (every page the presenter's) unless a
    test makes it a room (the ``room`` fixture)."""
    from lab.app.access import Access

    return Access.for_app("127.0.0.1", environ={})


def serve_lab(db_path, access):
    """The app of app.py (same host process, same build_app), served on a free port, engines loading:
    (host, app, url). The browser tests' fixture and bench.page_ends serve it so."""
    from lab.app.ui import build_app

    host = RemoteHost(EngineConfig(device="cpu", max_model_len=1024),  # the default KV budget, as screenshots show
                      db_path=db_path)
    host.start_loading()
    app = build_app(host, access)
    port = free_port()
    app.queue(default_concurrency_limit=8).launch(server_name="127.0.0.1", server_port=port,
                                                  prevent_thread_lock=True, quiet=True)
    return host, app, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def served(tmp_path_factory, access):
    """serve_lab's app, its engines loaded."""
    host, app, url = serve_lab(tmp_path_factory.mktemp("db") / "results.sqlite", access)
    assert host.wait_ready(timeout_s=300), host.status.text()
    yield host, url
    app.close()
    host.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run `make setup-dev`")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def typed(page, selector, text):
    """Type ``text`` as a person does: once the field shows, filled, then the field left (Tab); typed again if the
    page redrew the field meanwhile (a form just opened mounts its fields, and a click at once sent the old,
    empty value), so the next click sends what the field holds."""
    page.wait_for_selector(selector, state="visible")
    for _ in range(3):
        page.fill(selector, text)
        page.press(selector, "Tab")
        page.wait_for_timeout(500)
        if page.input_value(selector) == text:
            return
    raise AssertionError(f"{selector} did not keep {text!r}; it holds {page.input_value(selector)!r}")


def wait_until(page, script: str, timeout_s: float, watched: list[str], arg=None, wanted: str = "") -> None:
    """Wait until ``script`` (given ``arg``) holds; a time-out says what each of the ``watched`` selectors showed."""
    try:
        page.wait_for_function(script, arg=arg, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        shown = page.evaluate("(sels) => sels.map(s => document.querySelector(s)?.innerText ?? '(no such element)')",
                              watched)
        raise AssertionError(f"{' and '.join(watched)} did not {wanted or 'satisfy ' + script} in {timeout_s} s; "
                             f"shown: {shown!r}") from None


SHOWS = "([sel, text]) => { const e = document.querySelector(sel); return e && e.innerText.includes(text); }"


def wait_text(page, selector, text, timeout_s):
    """Wait until ``selector`` shows ``text``; a time-out says what it showed instead."""
    wait_until(page, SHOWS, timeout_s, [selector], arg=[selector, text], wanted=f"show {text!r}")


def sign_in(page, token: str, role: str) -> None:
    """Type ``token`` into the sign-in box and press Sign in until the role line says ``role`` (a click that comes
    before the page has taken the typed token in sends an empty one, which changes nothing: pressed again)."""
    page.fill("#presenter-token input", token)
    for attempt in range(3):
        page.click("#sign-in")
        try:
            return wait_text(page, "#role", role, 10)
        except AssertionError:
            if attempt == 2:
                raise
            page.fill("#presenter-token input", token)  # the box empties after a sign-in that was taken


def open_ready(browser, url, **options):
    """A new page on the app, once it says the engines are ready."""
    page = browser.new_page(**options)
    page.goto(url)
    wait_text(page, "#load-status", "Engines ready", 60)
    page.wait_for_function("() => document.querySelector('#estimate')?.innerText.trim()", timeout=30_000)  # the
    #                       page's load events have ended (the estimate comes last): they no longer redraw the form
    page.wait_for_selector("#run:enabled, #cancel:enabled, #run-watch", timeout=30_000)  # what this page may
    #                       press, as its first frame says (an attendee's: nothing, the note beside Run)
    return page


def submit(page, users, output_len, amount=None):
    """Fill the load-test form and press Run."""
    page.fill("#users textarea", users)
    page.fill("#output-len input", str(output_len))
    if amount is not None:
        page.fill("#amount input", str(amount))
    page.click("#run")


ROOM_TOKEN = "workshop-token-25"


@pytest.fixture
def room(access):
    """For one test, the served app is a workshop room: a presenter token is set, and a page watches until it
    shows the token."""
    access.token = ROOM_TOKEN
    yield ROOM_TOKEN
    access.token = None
    access.presenters.clear()


def watching(page, prefix, controls="Run and Cancel"):
    """An attendee's tab: its Run and Cancel disabled from the first frame, the reason beside them."""
    wait_text(page, f"#{prefix}-watch", f"Presenter only: {controls}", 20)
    assert page.is_disabled(f"#{prefix}-run") and page.is_disabled(f"#{prefix}-cancel")


def open_tab(browser, url, tab, run, **options):
    """A new page on one of the app's tabs (its Run button visible), once the engines are ready."""
    page = open_ready(browser, url, **options)
    page.get_by_role("tab", name=tab).click()
    page.wait_for_selector(run, state="visible")
    return page
