"""The page's side of lab.app.access: the presenter's sign-in line, and the guard every command handler goes
through on the server (the rule reads the call's gr.Request: its session and headers, never what the page
claims).

``Guard(access)(handler, "Starting a run")`` is the handler behind the rule: a presenter's call runs it, an
attendee's returns the refusal (the handler's message line shows it) and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from lab.app.access import Access

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


class Guard:
    """Wraps command handlers in the presenter rule (see the module doc)."""

    def __init__(self, access: Access):
        self.access = access

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

    # -- the sign-in line -------------------------------------------------------------------------
    def role(self, request: gr.Request) -> str:
        """This page's role line."""
        if self.access.open:
            return ""
        return PRESENTER if self.refusal("", request) is None else ATTENDEE

    def sign_in(self, token: str, request: gr.Request):
        """Sign this page in with ``token``: its role line, the token box emptied, and the sign-in box shown
        unless every page is the presenter's."""
        box = gr.update(visible=not self.access.open)
        if not token:
            return self.role(request), gr.skip(), box
        signed = self.access.sign_in(request.session_hash, token.strip())
        return (self.role(request) if signed else f"{WRONG} {ATTENDEE}"), "", box


def sign_in_line(app: gr.Blocks, guard: Guard) -> None:
    """The role line and, unless every page is the presenter's, the sign-in box; a token in the page's URL
    signs it in as it loads (call inside ``app``, at the top)."""
    role = gr.Markdown(elem_id="role")
    with gr.Accordion("Presenter sign-in", open=False, visible=not guard.access.open, elem_id="sign-in-box") as box:
        with gr.Row():
            token = gr.Textbox("", label="Presenter token", type="password", elem_id="presenter-token", scale=3)
            button = gr.Button("Sign in", elem_id="sign-in", scale=1)
    outputs = [role, token, box]
    button.click(guard.sign_in, [token], outputs, api_visibility="private")
    token.submit(guard.sign_in, [token], outputs, api_visibility="private")
    app.load(guard.sign_in, [token], outputs, js=TOKEN_FROM_URL, api_visibility="private")
