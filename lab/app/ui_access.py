"""The page's side of lab.app.access: the presenter's sign-in line, the controls the rule enables on each page,
and the guard every command handler goes through on the server (the rule reads the call's gr.Request: its
session and headers, never what the page claims).

``Guard(access)(handler, "Starting a run")`` is the handler behind the rule: a presenter's call runs it, an
attendee's returns the refusal and changes nothing (an API client's call included). On the page, each tab hands
its buttons to ``Guard.gate`` and the lines beside them to ``Guard.watch``: an attendee's page shows those
buttons disabled, with the reason beside them, from its first frame (lab.app.access.enabled decides).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from lab.app.access import Access, enabled, watch_note

TOKEN_FROM_URL = """(typed) => {
    const url = new URL(window.location.href);
    const token = url.searchParams.get('token') || '';
    if (token) { url.searchParams.delete('token'); window.history.replaceState(null, '', url.toString()); }
    return [token];
}"""  # the page's own link keeps no token in the address bar (a shared screen shows it)
PRESENTER = "**Presenter:** this page runs the lab (runs, cancel, restarts, sweeps, experiments, endpoints)."
ATTENDEE = ("**Watching** (an attendee's page): the plots, history and results follow the presenter's runs; "
            "starting, cancelling, restarting and connecting are the presenter's.")
WRONG = "**Not signed in:** that is not the presenter's token; this page keeps watching."


def headers_of(request: gr.Request | None) -> dict:
    """The call's headers, lower-cased (empty for a call with no request)."""
    return {k.lower(): v for k, v in dict(getattr(request, "headers", None) or {}).items()} if request else {}


@dataclass
class Watched:
    """A line beside presenter-only controls: the note on an attendee's page; on the presenter's, hidden (``own``
    False) or left to the answers of its controls (``own`` True: the line is theirs, e.g. Connect's), which
    ``presenter_words`` fill until they answer."""

    line: gr.Markdown
    controls: str
    own: bool = False
    presenter_words: str = ""

    def update(self, presenter: bool) -> dict:
        if presenter:
            return gr.update(value=self.presenter_words) if self.own else gr.update(value="", visible=False)
        return gr.update(value=watch_note(self.controls), visible=True)


class Guard:
    """The presenter rule on the page (see the module doc)."""

    def __init__(self, access: Access):
        self.access = access
        self.controls: list[tuple[str, gr.Button]] = []  # (kind, button), in the order the tabs gated them
        self.notes: list[Watched] = []
        self.starts: list = []  # the tabs' start events: the page redraws its controls as each one answers

    def refusal(self, action: str, request: gr.Request | None) -> str | None:
        """Why this call may not do ``action``, or None."""
        return self.access.refusal(action, getattr(request, "session_hash", None), headers_of(request))

    def __call__(self, handler: Callable, action: str, refused: Callable[[str], object] = lambda words: words):
        """``handler`` behind the rule; ``refused(words)`` is what an attendee's call returns (default: the words,
        for a handler with one message output)."""
        def guarded(request: gr.Request, *inputs):
            words = self.refusal(action, request)
            return refused(words) if words else handler(*inputs)

        guarded.__name__, guarded.__doc__ = handler.__name__, handler.__doc__  # not wraps: Gradio reads the signature
        return guarded

    # -- the controls a page may press ---------------------------------------------------------------
    def gate(self, kind: str, *buttons: gr.Button) -> None:
        """Put ``buttons`` (of a kind of lab.app.access) under the rule."""
        self.controls += [(kind, button) for button in buttons]

    def watch(self, line: gr.Markdown, controls: str, own: bool = False, presenter_words: str = "") -> gr.Markdown:
        """Show the presenter-only note for ``controls`` in ``line`` on an attendee's page (see Watched)."""
        self.notes.append(Watched(line, controls, own, presenter_words))
        return line

    def note(self, controls: str, elem_id: str) -> gr.Markdown:
        """A line of its own for the note beside ``controls`` (hidden on the presenter's page)."""
        return self.watch(gr.Markdown(visible=False, elem_id=elem_id, elem_classes="kv-watch"), controls)

    def started(self, event):
        """A tab's start event (a Run's click): its page redraws its controls as soon as it answers."""
        self.starts.append(event)
        return event

    def buttons(self) -> list[gr.Button]:
        return [button for _, button in self.controls]

    def button_updates(self, presenter: bool, ready: bool, running: bool, restarting: bool) -> list:
        """Every gated button pressable or not, as lab.app.access.enabled says."""
        allowed = enabled(presenter, ready, running, restarting)
        return [gr.update(interactive=allowed[kind]) for kind, _ in self.controls]

    # -- roles ---------------------------------------------------------------------------------------
    def is_presenter(self, request: gr.Request | None) -> bool:
        return self.refusal("", request) is None

    def role_line(self, presenter: bool) -> str:
        """The role line at the top of the page."""
        if self.access.open:
            return ""
        return PRESENTER if presenter else ATTENDEE

    def role_updates(self, presenter: bool) -> list:
        """The role line, the sign-in box (shown until the page is the presenter's) and every note."""
        return [self.role_line(presenter), gr.update(visible=not presenter),
                *[note.update(presenter) for note in self.notes]]

    def role_outputs(self, sign_in: SignIn) -> list:
        return [sign_in.role, sign_in.box, *[note.line for note in self.notes]]

    def sign_in(self, token: str, request: gr.Request) -> list:
        """Sign this page in with ``token``: the token box emptied, then role_updates (a wrong token says so)."""
        if not token:
            return [gr.skip(), *self.role_updates(self.is_presenter(request))]
        signed = self.access.sign_in(request.session_hash, token.strip())
        role, *rest = self.role_updates(signed)
        return ["", role if signed else f"{WRONG} {ATTENDEE}", *rest]


@dataclass
class SignIn:
    """The role line and the sign-in box at the top of the page."""

    role: gr.Markdown
    box: gr.Accordion
    token: gr.Textbox
    button: gr.Button


def sign_in_line(guard: Guard) -> SignIn:
    """The role line and the sign-in box (call inside the Blocks, at the top; the first frame says who sees what)."""
    role = gr.Markdown(elem_id="role")
    with gr.Accordion("Presenter sign-in", open=False, visible=not guard.access.open, elem_id="sign-in-box") as box:
        with gr.Row():
            token = gr.Textbox("", label="Presenter token", type="password", elem_id="presenter-token", scale=3)
            button = gr.Button("Sign in", elem_id="sign-in", scale=1)
    return SignIn(role=role, box=box, token=token, button=button)


def wire_sign_in(app: gr.Blocks, sign_in: SignIn, handler: Callable, outputs: list) -> None:
    """Sign-in by the button, Enter, or a token in the page's URL as it loads; ``handler(token, request)`` returns
    the token box, the role's updates and ``outputs``'s (call once every tab has gated its controls)."""
    quiet = {"api_visibility": "private", "show_progress": "hidden"}
    every = [sign_in.token, *outputs]
    sign_in.button.click(handler, [sign_in.token], every, **quiet)
    sign_in.token.submit(handler, [sign_in.token], every, **quiet)
    app.load(handler, [sign_in.token], every, js=TOKEN_FROM_URL, **quiet)
