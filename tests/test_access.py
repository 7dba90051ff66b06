"""The workshop's rules (lab.app.access): who is the presenter, and where an endpoint may point."""

import socket

import pytest

from lab.app.access import HOSTS_ENV, TOKEN_HEADER, Access
from lab.config import is_public

TOKEN = "s3cret-token"


def test_on_127_0_0_1_with_no_token_every_page_is_the_presenters():
    access = Access.for_app("127.0.0.1", environ={})
    assert access.open and access.local and access.refusal("Starting a run", "any-session") is None


@pytest.mark.parametrize("host, share", [("0.0.0.0", False), ("127.0.0.1", True), ("10.0.0.7", False)])
def test_served_beyond_this_machine_a_token_is_made_and_attendees_are_refused(host, share):
    access = Access.for_app(host, share, environ={})
    assert access.made and len(access.token) >= 16 and not access.local
    assert access.link("http://h:7860/") == f"http://h:7860/?token={access.token}"
    words = access.refusal("Starting a run", "attendee")
    assert words.startswith("**Presenter only:** Starting a run is the presenter's") and "?token=" in words
    assert not access.sign_in("attendee", "wrong") and access.refusal("Cancelling", "attendee")
    assert access.sign_in("presenter", access.token) and access.refusal("Cancelling", "presenter") is None
    assert access.refusal("Cancelling", "api", {TOKEN_HEADER: access.token}) is None
    assert access.refusal("Cancelling", "api", {TOKEN_HEADER: "nope"})


def test_the_environment_sets_the_token_and_a_short_one_is_refused_before_anything_loads():
    access = Access.for_app("127.0.0.1", environ={"KVLAB_PRESENTER_TOKEN": TOKEN})
    assert access.token == TOKEN and not access.made and not access.open and access.local
    with pytest.raises(ValueError, match="has 3 characters, below the limit of 8") as err:
        Access.for_app("0.0.0.0", environ={"KVLAB_PRESENTER_TOKEN": "abc"})
    assert "abc" not in str(err.value)  # the token itself is never echoed


def test_endpoints_are_off_on_a_space_unless_enabled():
    space = Access.for_app("0.0.0.0", environ={"SPACE_ID": "me/kv-lab"})
    assert "KVLAB_ENDPOINTS=1" in space.endpoint_refusal("https://api.example.com")
    enabled = Access.for_app("0.0.0.0", environ={"SPACE_ID": "me/kv-lab", "KVLAB_ENDPOINTS": "1"})
    assert enabled.endpoint_refusal("http://8.8.8.8:8000") is None


@pytest.mark.parametrize("url, shown", [
    ("http://127.0.0.1:8000", "127.0.0.1"), ("http://localhost:8000", "127.0.0.1"), ("http://10.1.2.3", "10.1.2.3"),
    ("http://169.254.169.254/latest", "169.254.169.254"), ("http://[::1]:8000", "::1"),
    ("http://[::ffff:192.168.0.1]", "::ffff:192.168.0.1"), ("http://0.0.0.0:80", "0.0.0.0"),
])
def test_an_app_serving_others_refuses_internal_addresses(url, shown):
    access = Access.for_app("0.0.0.0", environ={})
    words = access.endpoint_refusal(url)
    assert f"resolves to {shown}, not a public address" in words and f"{HOSTS_ENV}=" in words
    assert Access.for_app("127.0.0.1", environ={}).endpoint_refusal(url) is None  # the app on this machine: any


def test_every_address_a_name_resolves_to_is_checked_and_the_allow_list_opens_a_host(monkeypatch):
    answers = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 80)) for a in ("93.184.216.34", "10.0.0.5")]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answers)
    access = Access.for_app("0.0.0.0", environ={})
    assert "'mixed.example' resolves to 10.0.0.5" in access.endpoint_refusal("http://mixed.example:8000")
    allowed = Access.for_app("0.0.0.0", environ={HOSTS_ENV: "gpu-box, Mixed.example"})
    assert allowed.endpoint_refusal("http://mixed.example:8000") is None
    answers[1:] = []
    assert access.endpoint_refusal("http://mixed.example:8000") is None  # public only


def test_public_means_global_unicast():
    assert is_public("8.8.8.8") and is_public("2606:4700::1111")
    assert not any(map(is_public, ("100.64.0.1", "224.0.0.1", "fe80::1%eth0", "fc00::1", "::")))


def test_the_page_handler_refuses_an_internal_endpoint_before_the_host_sees_it():
    from lab.app.ui import Handlers
    from lab.app.ui_access import Guard

    class Host:
        def connect_endpoint(self, endpoint):
            raise AssertionError("the host was asked")

    handlers = Handlers(Host(), Guard(Access.for_app("0.0.0.0", environ={})))
    answer, _ = handlers.connect("", "http://10.0.0.5:8000", "", "")
    assert answer.startswith("**Not connected:** endpoint host '10.0.0.5' resolves to 10.0.0.5")


def test_the_page_handler_hands_the_host_an_endpoint_held_to_public_addresses_where_the_rules_say(monkeypatch):
    from lab.app.ui import Handlers
    from lab.app.ui_access import Guard

    asked = []

    class Host:
        def connect_endpoint(self, endpoint):
            asked.append(endpoint.public_only)
            return False, "not here"

    public = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 8000))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: public)
    for host, environ in (("0.0.0.0", {}), ("0.0.0.0", {HOSTS_ENV: "gpu.example"}), ("127.0.0.1", {})):
        Handlers(Host(), Guard(Access.for_app(host, environ=environ))).connect("", "http://gpu.example:8000", "", "")
    assert asked == [True, False, False]  # served to others; an allowed host; this machine's own app


@pytest.fixture
def rebinding(monkeypatch):
    """A server on 127.0.0.1 and a host name that resolves to a public address at the check, then to 127.0.0.1 (a
    DNS rebinding attack); yields the URL and the handler's answer."""
    import http.server
    import threading

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200), self.send_header("Content-Length", "2"), self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, real, asked = server.server_address[1], socket.getaddrinfo, []

    def resolve(host, *args, **kwargs):
        if host != "rebind.example":
            return real(host, *args, **kwargs)
        asked.append(host)
        ip = "93.184.216.34" if len(asked) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    yield f"http://rebind.example:{port}", server
    server.shutdown()


def test_a_name_that_resolves_anew_to_an_internal_address_gets_no_connection(rebinding):
    from lab.config import Endpoint
    from lab.engines.openai import probe

    url, server = rebinding
    access = Access.for_app("0.0.0.0", environ={})
    assert access.endpoint_refusal(url) is None and access.public_only(url)  # the check saw a public address
    with pytest.raises(ValueError, match="resolves to 127.0.0.1 now, not a public address: no connection made"):
        probe(Endpoint(url, model="m", public_only=True))
    probe(Endpoint(f"http://127.0.0.1:{server.server_address[1]}", model="m"))  # the same server, where allowed
    with pytest.raises(ValueError, match="resolves to 127.0.0.1 now"):  # HTTPS: refused before any TLS
        probe(Endpoint(url.replace("http:", "https:"), model="m", public_only=True))


def test_a_connection_to_an_ipv6_loopback_or_a_mapped_private_address_is_refused():
    from lab.engines.openai import public_connection

    for host in ("::1", "::ffff:10.0.0.5"):
        with pytest.raises(OSError, match=f"{host} resolves to {host} now, not a public address"):
            public_connection((host, 9))


def test_an_endpoint_engines_requests_resolve_through_the_public_only_resolver(rebinding):
    import asyncio

    from lab.config import Endpoint, EngineConfig
    from lab.engines.openai import OpenAIEngine
    from lab.model import resolve_model

    url, _ = rebinding
    assert Access.for_app("0.0.0.0", environ={}).endpoint_refusal(url) is None  # the check saw a public address
    engine = OpenAIEngine(Endpoint(url, model="m", public_only=True), EngineConfig(device="cpu"), resolve_model(None))
    with pytest.raises(Exception, match="resolves to 127.0.0.1 now, not a public address"):
        asyncio.run(engine.start())
