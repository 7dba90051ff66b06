"""Who may command the app, and where an endpoint may point: the workshop's rules, in one place.

A workshop has one presenter and a room of attendees. The presenter starts and cancels runs, restarts engines,
runs sweeps and experiments (the Why ladder too) and connects endpoints; attendees watch live and browse history
and results. The presenter is whoever shows the token: typed once on the page (or opened as ``?token=`` in the
link app.py prints), which signs that page's session in on the server; an API client sends it in the
``X-KVLab-Token`` header. The token comes from KVLAB_PRESENTER_TOKEN (a Space's secret) or is made at start;
on 127.0.0.1 with no token set there is no room, and every page is the presenter's.

An endpoint makes the server fetch a URL. Endpoints are presenter-only, off on a Space unless KVLAB_ENDPOINTS=1,
and, when the app serves other machines, may reach only public addresses unless KVLAB_ENDPOINT_HOSTS names the
host: every address the host name resolves to is checked before the engine starts, and each connection's own
address again as it is made (a name that resolves anew, as in DNS rebinding, reaches no internal address).

``enabled`` is the one rule of what a page may press, by role and by what the host is doing; every tab's controls
follow it (an attendee's page shows them disabled with ``watch_note`` beside them), and the API keeps refusing
what is not the caller's (``Access.refusal``): a page is not the only client.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lab.config import is_public

TOKEN_ENV = "KVLAB_PRESENTER_TOKEN"
ENDPOINTS_ENV = "KVLAB_ENDPOINTS"  # "1": endpoints on, on a Space too
HOSTS_ENV = "KVLAB_ENDPOINT_HOSTS"  # comma list of host names an endpoint may reach whatever they resolve to
TOKEN_HEADER = "x-kvlab-token"
MIN_TOKEN_CHARS = 8  # shorter is guessable by a room of curious attendees
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
START, CANCEL, COMMAND = "start", "cancel", "command"  # the kinds of control a page offers (see enabled)
HOW_TO_SIGN_IN = ("Presenter: enter the token in *Presenter sign-in* at the top of the page, or open the link "
                  "app.py printed (it ends in `?token=`); an API client sends it in the X-KVLab-Token header.")


@dataclass
class Access:
    """The app's presenter rule and endpoint rule.

    Attributes:
        token: What the presenter shows; None: every page is the presenter's (127.0.0.1, no token set).
        local: The app serves this machine only (127.0.0.1 without --share): endpoints may reach any address.
        endpoints_on: Whether endpoints may be connected at all (off on a Space unless KVLAB_ENDPOINTS=1).
        allowed_hosts: Host names an endpoint may reach whatever they resolve to (KVLAB_ENDPOINT_HOSTS).
        made: Whether the token was made at start (app.py then prints the presenter's link).
    """

    token: str | None = None
    local: bool = True
    endpoints_on: bool = True
    allowed_hosts: tuple[str, ...] = ()
    made: bool = False
    presenters: set[str] = field(default_factory=set, repr=False)  # session hashes that showed the token

    @classmethod
    def for_app(cls, host: str, share: bool = False, environ: Mapping[str, str] = os.environ) -> Access:
        """The rules for an app served on ``host`` (ValueError for a token too short, before anything loads)."""
        local = host in LOCAL_HOSTS and not share
        token = environ.get(TOKEN_ENV) or None
        check_token(token)
        made = token is None and not local
        hosts = tuple(h.strip().lower() for h in environ.get(HOSTS_ENV, "").split(",") if h.strip())
        return cls(token=secrets.token_urlsafe(12) if made else token, local=local, made=made, allowed_hosts=hosts,
                   endpoints_on=not environ.get("SPACE_ID") or environ.get(ENDPOINTS_ENV) == "1")

    @property
    def open(self) -> bool:
        """No room: every page is the presenter's."""
        return self.token is None

    def link(self, base_url: str) -> str:
        """The presenter's link to the page (the token in it)."""
        return f"{base_url.rstrip('/')}/?token={self.token}"

    def sign_in(self, session: str | None, token: str | None) -> bool:
        """Make ``session`` the presenter's if ``token`` is the token; True when it is (or nobody needs one)."""
        if self.open:
            return True
        if not (token and session and secrets.compare_digest(token.encode(), self.token.encode())):
            return False
        self.presenters.add(session)
        return True

    def is_presenter(self, session: str | None, headers: Mapping[str, str] | None = None) -> bool:
        """Whether a call from ``session`` (with ``headers``) is the presenter's."""
        if self.open or (session and session in self.presenters):
            return True
        shown = (headers or {}).get(TOKEN_HEADER, "")
        return bool(shown) and secrets.compare_digest(shown.encode(), self.token.encode())

    def refusal(self, action: str, session: str | None, headers: Mapping[str, str] | None = None) -> str | None:
        """Why ``action`` ("Starting a run") is refused to this caller, or None for the presenter."""
        if self.is_presenter(session, headers):
            return None
        return f"**Presenter only:** {action} is the presenter's; this page watches. {HOW_TO_SIGN_IN}"

    def endpoint_refusal(self, url: str) -> str | None:
        """Why the server must not connect to ``url`` (endpoints off, or an internal address), or None."""
        if not self.endpoints_on:
            return (f"endpoints are off on this Space: the server would fetch whatever URL a page names. Its owner "
                    f"may set {ENDPOINTS_ENV}=1 in the Space's settings (only the presenter connects).")
        if not self.public_only(url):
            return None
        parts = urlsplit(url)
        return internal_address_refusal((parts.hostname or "").lower(), parts.port)

    def public_only(self, url: str) -> bool:
        """Whether the server may connect to ``url``'s public addresses only (checked here, and again at each
        connection: Endpoint.public_only)."""
        return not (self.local or (urlsplit(url).hostname or "").lower() in self.allowed_hosts)


def enabled(presenter: bool, ready: bool, running: bool, restarting: bool) -> dict[str, bool]:
    """Which kinds of control a page may press now. A start (Run, Workshop demo, every tab's Run) once the engines
    are ready and nothing runs; a Cancel while a run, experiment or sweep goes (a restart of dead engines runs to its
    end); a command (Restart dead engines, Connect) at any time (the host answers what it cannot do now). On an
    attendee's page, none: the page watches."""
    allowed = {START: ready and not running, CANCEL: running and not restarting, COMMAND: True}
    return {kind: presenter and ok for kind, ok in allowed.items()}


def watch_note(controls: str) -> str:
    """The line an attendee's page shows beside ``controls`` ("Run and Cancel"), which it shows disabled."""
    return f"**Presenter only:** {controls} (this page watches the presenter's runs live)."


def check_token(token: str | None) -> None:
    """A presenter token must be at least MIN_TOKEN_CHARS long (the token itself is never echoed)."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{TOKEN_ENV} has {len(token)} characters, below the limit of {MIN_TOKEN_CHARS}: set a "
                         f"longer one (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(12))'`) or unset "
                         f"it and app.py makes one and prints the presenter's link")


def internal_address_refusal(host: str, port: int | None) -> str | None:
    """Why ``host`` is no place for this server to connect (it, or an address it resolves to, is not public)."""
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port or 80, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError) as exc:
        return f"endpoint host {host!r} does not resolve ({exc}): give a public host name or address"
    inner = sorted(a for a in found if not is_public(a))
    if not inner:
        return None
    return (f"endpoint host {host!r} resolves to {inner[0]}, not a public address (loopback, private, link-local "
            f"and reserved ones are refused): this app serves other machines, so the server connects only to "
            f"public addresses. To allow this host, start the app with {HOSTS_ENV}={host}")
