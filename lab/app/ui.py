"""build_app(): the Gradio layout and its wiring; the handlers it wires are small named methods of Handlers.

Every figure and table comes from lab.app.dashboard / lab.plots / lab.store, the functions the CLI and the
notebooks use. State lives in the Host passed in (no module globals). As in trackio, a gr.Timer writes
cheap change keys into gr.State once a second, and a group of components is redrawn only when its own key
changed (the State's change event): the load status line, the live plots, the runs table when a run ends,
the environment when the engines become ready. A page's first frame already carries every group (and the
form of the current or last run): app.frame (lab.app.ui_frame). What a page may press follows one rule
(lab.app.access.enabled), per role: an attendee's page shows the presenter's controls disabled, the reason beside
them.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass, replace
from typing import Generic

import gradio as gr
import pandas as pd

from lab.app.access import CANCEL, COMMAND, START, Access
from lab.app.dashboard import (
    BOUND_REQUESTS,
    BOUND_SECONDS,
    RATE_FIELD,
    Compared,
    LoadForm,
    OverTime,
    PerLevel,
    T,
    agreement_warning,
    busy_words,
    engine_choices,
    environment_markdown,
    over_time_view,
    parts,
    per_level_key,
    per_level_view,
    plan_from_inputs,
    progress_text,
    stored_progress,
    stored_view,
)
from lab.app.mirror import holding
from lab.app.seam import Host
from lab.app.ui_access import Guard, SignIn, sign_in_line, wire_sign_in
from lab.app.ui_capacity import build_capacity_tab, build_searches_list
from lab.app.ui_frame import FirstFrame, LivePage
from lab.app.ui_kv import build_kv_tab
from lab.app.ui_predict import build_predict_tab
from lab.app.ui_sweep import build_sweep_tab
from lab.app.ui_timer import Pace, Ticker, skipped, start_task
from lab.app.ui_why import build_why_tab
from lab.config import ENDPOINT_ENGINE, MAX_REPEATS, Endpoint
from lab.environment import shm_warning
from lab.estimate import History, estimate_text, probes_of, stored_history
from lab.load.workloads import WORKLOADS
from lab.plots import EMPTY_WORDS, LATENCY_COLUMNS, compare_figure, compare_ratio_figure, empty_figure, latency_table
from lab.presets import workshop_demo
from lab.report import write_report
from lab.runs import summary_dict
from lab.status import EngineHealth, RunStatus
from lab.store import DETAIL_COLUMNS, LEAD_COLUMNS, export_run, list_runs, list_summaries, load_summary, run_label

INTRO = """# KV Lab — how much vLLM outruns HF `generate()` here, and why
One model, loaded by each engine: **HF transformers** with static batching (a padded batch runs until its longest
request ends; its KV cache is one contiguous block per batch) and **vLLM** (KV in blocks, continuous batching and,
on a GPU, CUDA graphs). Pick a workload and concurrent users, press **Run**, and watch both measured live; the
**Why** tab measures which of those mechanisms the ratio comes from on this device."""
PEAK_NOTE = ("*Over time, each point counts the tokens that arrived in one second; a level's bar divides all "
             "its tokens by its whole duration, which includes its first prefill and the tail when few requests "
             "are left, so the per-second peaks lie above the bar.*")
LATENCY_WIDTHS = ["72px", "62px", "70px", "86px", "56px", "72px", "76px"] + ["80px"] * 9  # fits 1280 px: 1,214
PAGE_STYLE = """<style>
.kv-busy {display: flex; align-items: center; gap: 0.6em; font-weight: 600; color: #0b6e69; margin: 2px 0;}
.kv-spin {width: 14px; height: 14px; border: 3px solid #cdeeed; border-top-color: #17bebb; border-radius: 50%;
          display: inline-block; animation: kv-spin 0.8s linear infinite;}
@keyframes kv-spin {to {transform: rotate(360deg);}}
#latency :is(th, td) *, #runs-table :is(th, td) *, #runs-details :is(th, td) * {word-break: normal;
    overflow-wrap: normal; hyphens: none;}
</style>"""  # the busy line's spinner; table cells wrap between words only
TICK_S = 1.0  # how often each page asks the host whether anything changed (a full room asks less: ui_timer.Pace)
QUIET = {"show_progress": "hidden", "api_visibility": "private"}  # timer-driven events: no spinner, no API
DEFAULT_FORM = LoadForm(engines=None, users="1,5,10,20", workload="mixed", output_len=0, bound=BOUND_REQUESTS,
                        amount=2, repeats=1, rate=0, slo="")  # the form before anything ran (engines: all loaded)
HIDDEN = {"show_progress": "hidden"}  # an API event whose answer comes at once: no "0.1s" timer over its line
RESTART_HINT = "Run restarts a dead engine of its plan first, too."  # beside the presenter's Restart button


def shm_words() -> str:
    """The header's /dev/shm warning ('' when there is room; the page's process shares the engines' machine)."""
    warning = shm_warning()
    return f"**Warning:** {warning}." if warning else ""


class Handlers:
    """Every event handler of the page, over one Host: actions, change keys and the redraws they gate."""

    def __init__(self, host: Host, guard: Guard | None = None):
        self.host, self.guard = host, guard or Guard(Access())  # default: every page the presenter's
        self._past, self._past_lock = (None, None), threading.Lock()

    # -- actions -------------------------------------------------------------------------------
    def start_run(self, *values) -> str:
        """Start a run from the Load-test form's values (LoadForm's order); returns the message line."""
        return start_task(self.host, lambda: plan_from_inputs(self.host.config, **vars(LoadForm(*values))))

    def estimate(self, *values) -> str:
        """How long Run would take here, computed from stored runs; a dead engine of the plan is restarted first,
        its last start counted. Nothing while the form has an input error (the message line under Run says it)."""
        try:
            plan = plan_from_inputs(self.host.config, **vars(LoadForm(*values)))
        except ValueError:
            return ""
        health = self.host.health()
        restarts = {name: health[name].get("last_start_s") or 0.0 for name in plan.engines
                    if name in self.host.dead()}
        return estimate_text(plan, self.past(), self.host.check.memory.device.name, restarts)

    def past(self) -> History:
        """The costs fitted to the stored runs: read and fitted once per host version (it moves with every change
        the host draws, a run's end included), however many pages ask (a room of pages redraws its estimate at the
        same run's end); runs another process stores show after the version's next move."""
        with self._past_lock:
            version = self.host.version
            if self._past[0] != version:  # the host's version is an int from the start
                self._past = (version, stored_history(self.host.db_path, self.host.check.model,
                                                      self.host.check.memory.device.name,
                                                      probes_of(self.host.health())))
            return self._past[1]

    def form_error(self, message: str, *values):
        """As the form changes, its input error on the message line under Run (the one place it shows, before Run
        as after); a form fixed drops the last one (other lines stay)."""
        try:
            plan_from_inputs(self.host.config, **vars(LoadForm(*values)))
        except ValueError as exc:
            return f"**Input error:** {exc}"
        return "" if (message or "").startswith("**Input error:**") else gr.skip()

    def progress_now(self) -> str:
        """The progress line right after Run (the timer would redraw it only at its next tick)."""
        return progress_text(self.host.last("run"))

    def run_ended(self, message: str):
        """Once the run has ended, this page's 'started' or 'Cancelling' line for it says so (others stay)."""
        result = self.host.last("run")
        if result is None or result.status == RunStatus.RUNNING:  # the key also changes when a new run starts
            return gr.skip()
        if not (result.id in (message or "") or (message or "").startswith("Cancelling")):
            return gr.skip()
        return f"Run {result.id} ended: {result.status}."

    def form_now(self) -> LoadForm:
        """The current (or last) run's settings, for a page that opens at any time: the running or last run of
        this app, else the newest stored one, else the form's defaults."""
        result = self.host.last("run")
        if result is not None:
            form = LoadForm.of_plan(result.plan)
        elif stored := self.last_stored():
            form = LoadForm.of_summary(stored)
        else:
            form = replace(DEFAULT_FORM, engines=list(self.host.engine_names))
        form.engines = [name for name in form.engines if name in self.host.engine_names]
        return form

    def form_key(self) -> tuple | None:
        """Changes when a run starts and when it ends (the form and its estimate in a page's first frame)."""
        result = self.host.last("run")
        return None if result is None else (result.id, result.status == RunStatus.RUNNING)

    def form_frame(self) -> list:
        """The form of form_now and its estimate, for a page's first frame."""
        values = parts(self.form_now())
        return [*values, self.estimate(*values)]

    def last_stored(self) -> dict | None:
        """The newest stored run's summary.json, if any."""
        stored = list_summaries(self.host.db_path, limit=1)
        return stored[0] if stored else None

    def demo_form(self) -> list:
        """The Workshop demo's form values for this device."""
        preset = workshop_demo(self.host.config)
        return parts(LoadForm(engines=list(preset.plan(self.host.config).engines), users=preset.users,
                              workload=preset.workload, output_len=preset.output_len, bound=BOUND_REQUESTS,
                              amount=preset.requests_per_user, repeats=preset.repeats, rate=0, slo=""))

    def demo(self) -> list:
        """The Workshop demo: the form filled for this device and Run pressed; the form's values, then the message
        line."""
        values = self.demo_form()
        return [*values, self.start_run(*values)]

    def connect(self, name: str, url: str, model: str, key: str):
        """Add an OpenAI-compatible server as an engine; returns the answer shown under Connect and the engine
        choices."""
        try:
            endpoint = Endpoint(base_url=(url or "").strip(), name=(name or "").strip() or ENDPOINT_ENGINE,
                                model=(model or "").strip() or None, api_key=key or None)  # never the host's own key
        except ValueError as exc:
            return f"**Input error:** {exc}", gr.skip()
        refusal = self.guard.access.endpoint_refusal(endpoint.base_url)
        if refusal:
            return f"**Not connected:** {refusal}", gr.skip()
        public_only = self.guard.access.public_only(endpoint.base_url)
        connected, message = self.host.connect_endpoint(replace(endpoint, public_only=public_only))
        if not connected:
            return f"**Not connected:** {message}", gr.skip()
        return message, gr.update(choices=engine_choices(self.host.engine_names))

    def cancel(self) -> str:
        """Cancel the run in progress; returns the message line."""
        return self.host.cancel()

    def run_and_wait(self, engines: str, users: str, workload: str, output_len: float, requests_per_user: float,
                     repeats: float = 1, rate: float = 0, slo: str = "", request: gr.Request = None) -> str:
        """Start a run, wait for it to end, and return its summary.json (for API clients); the numbers are floats
        so that the lab's rule, not the API's rounding, answers a fraction (the page's words, as an error). The
        presenter's only (the token in the X-KVLab-Token header)."""
        refusal = self.guard.refusal("Starting a run", request)
        if refusal:
            return json.dumps({"error": refusal})
        names = [e.strip() for e in engines.split(",") if e.strip()]
        try:
            plan = plan_from_inputs(self.host.config, engines=names, users=users, workload=workload,
                                    output_len=output_len, bound=BOUND_REQUESTS, amount=requests_per_user,
                                    repeats=repeats, rate=rate, slo=slo)
        except ValueError as exc:
            return json.dumps({"error": str(exc)})
        started, message = self.host.submit(plan)
        if not started:
            return json.dumps({"error": message})
        return json.dumps(summary_dict(self.host.wait_task()), default=str)

    # -- change keys: cheap, read every tick -----------------------------------------------------
    def status_key(self) -> str:
        """Changes with every loading step (the agreement warning comes with the last one) and with the
        engines' health (one dies, restarts, comes back)."""
        return self.host.status_text()

    def live_key(self) -> tuple | None:
        """Changes whenever the current run has something new to draw: while it goes, with the host's version;
        once it has ended, with its end's words and what it holds (a sweep's or an experiment's moves of the version
        redraw nothing here); None before the first run."""
        result = self.host.last("run")
        if result is None:
            return None
        if result.status == RunStatus.RUNNING:
            return result.id, self.host.version
        return result.id, str(result.status), result.message, holding(result)

    def runs_key(self) -> tuple:
        """Changes when a level begins or ends and when a run ends (the stored runs grow as levels finish)."""
        return self.finished_key(), self.per_level_key()

    def finished_key(self) -> str | None:
        """The id of the last run once it has ended (changes when a run finishes)."""
        result = self.host.last("run")
        return result.id if result and result.status != RunStatus.RUNNING else None

    def ready_key(self) -> tuple:
        """Changes when the engines become ready (or fail to load), and when one dies or comes back."""
        health = tuple(h["state"] for h in self.host.health().values())
        return self.host.status.ready, self.host.status.error, health

    # -- redraws -------------------------------------------------------------------------------
    def status_lines(self) -> tuple:
        """The status line (loading, or the engines' health), the agreement warning, and the row of Restart dead
        engines (shown while an engine is dead)."""
        return (self.host.status_text(), agreement_warning(self.host.agreement()),
                gr.update(visible=bool(self.host.dead())))

    def restart(self) -> str:
        """Restart the dead engines (the line beside the button answers; the status line follows the restart)."""
        started, message = self.host.restart_dead()
        return message if started else f"**Not restarted:** {message}"

    def live(self) -> list:
        """Progress line and the four figures over time of the current run (every change); before this app's
        first run, the newest stored run's line (its figures over time are drawn live only)."""
        result = self.host.last("run")
        if result is None:
            return parts(skipped(OverTime, progress=stored_progress(self.last_stored())))
        return parts(over_time_view(result))

    def per_level_key(self) -> tuple | None:
        """Changes when a level begins or ends (the per-level figures redraw only then)."""
        return per_level_key(self.host.last("run"))

    def per_level(self) -> list:
        """The per-level bars, the ratio and the latency table of the current run (before this app's first run,
        of the newest stored run)."""
        result = self.host.last("run")
        if result is not None:
            return parts(per_level_view(result))
        stored = self.last_stored()
        return parts(stored_view(stored) if stored else skipped(PerLevel))

    def busy_key(self) -> str:
        """Changes when a run, experiment or sweep starts or ends, and with the level a run is at."""
        return busy_words(self.host.task)

    def busy(self) -> str:
        """The busy line at the top of every tab: a spinner and what goes, or nothing (and the page's style)."""
        words = self.busy_key()
        return PAGE_STYLE + (f'<div class="kv-busy"><span class="kv-spin"></span>{words}</div>' if words else "")

    def buttons_key(self) -> tuple:
        """Changes with readiness and health, and when a run, experiment or sweep starts or ends."""
        return *self.ready_key(), self.host.running()

    def host_state(self) -> tuple[bool, bool, bool]:
        """What the rule of lab.app.access.enabled reads of the host: ready, running, restarting."""
        restarting = any(h["state"] == EngineHealth.RESTARTING for h in self.host.health().values())
        return self.host.status.ready, self.host.running(), restarting

    def buttons(self, request: gr.Request) -> list:
        """Every tab's gated buttons as the rule says for this page now (a start pressable once the engines are
        ready and nothing runs, a Cancel while something runs: the host runs one thing at a time)."""
        return self.guard.button_updates(self.guard.is_presenter(request), *self.host_state())

    def sign_in(self, token: str, request: gr.Request) -> list:
        """Sign the page in (ui_access.Guard.sign_in), then its buttons for its role."""
        return [*self.guard.sign_in(token, request), *self.buttons(request)]

    def role_key(self) -> tuple:
        """Changes with buttons_key, and when the app becomes a room (a presenter token set) or stops being one."""
        return *self.buttons_key(), self.guard.access.open

    def role_frame(self) -> list:
        """A page's first frame as an unsigned page sees it: its role (the presenter's when every page is),
        the notes beside the controls it may not press, and its buttons."""
        presenter = self.guard.access.open
        return [*self.guard.role_updates(presenter), *self.guard.button_updates(presenter, *self.host_state())]

    def environment(self) -> list:
        """The Environment tab: readable text and the raw dict."""
        env = self.host.environment()
        return parts(Shown(text=environment_markdown(env), raw=env))

    def load_runs(self) -> list:
        """The stored runs: what differs between them (when, engines, users, workload, tok/s, ratio, status),
        the details of each (id, device, model, lengths, estimate), and the compare dropdown's choices."""
        rows = list_runs(self.host.db_path)
        table = pd.DataFrame(rows)
        lead = [c for c in table.columns if c in LEAD_COLUMNS or c.endswith("tok/s") or c in ("vLLM/HF", "status")]
        details = table.reindex(columns=list(DETAIL_COLUMNS)) if rows else pd.DataFrame(columns=list(DETAIL_COLUMNS))
        return parts(Listed(runs=table[lead] if rows else pd.DataFrame(columns=list(LEAD_COLUMNS)), details=details,
                            chosen=gr.update(choices=[(run_label(row), row["run_id"]) for row in rows])))

    def compare(self, run_ids: list[str] | None) -> tuple:
        """Figures comparing the chosen runs, the first one's latency table and its two files."""
        if not run_ids:
            return parts(Compared(tok_s=compare_figure([]), ratio=compare_ratio_figure([]), args=None, report=None,
                                  latency=pd.DataFrame(columns=LATENCY_COLUMNS), requests=None, summary=None))
        try:
            summaries = [load_summary(self.host.db_path, rid) for rid in run_ids]
        except KeyError as exc:  # a crafted or stale id: the store's words, nothing read or written
            raise gr.Error(exc.args[0]) from None
        paths = export_run(self.host.db_path, run_ids[0], tempfile.mkdtemp(prefix="kvlab-export-"))
        report = write_report(str(paths["summary"].parent), paths["summary"].parent / f"report-{run_ids[0]}.html")
        return parts(Compared(tok_s=compare_figure(summaries), ratio=compare_ratio_figure(summaries),
                              latency=latency_table(summaries[0]), args=summaries[0].get("engine_args", {}),
                              requests=str(paths["requests"]), summary=str(paths["summary"]), report=str(report)))


@dataclass
class EndpointForm:
    """An OpenAI-compatible server's name, URL, served model and key (Handlers.connect's arguments), the Connect
    button and its answer."""

    name: gr.Textbox
    url: gr.Textbox
    model: gr.Textbox
    key: gr.Textbox
    connect: gr.Button
    answer: gr.Markdown

    def inputs(self) -> list:
        return [self.name, self.url, self.model, self.key]


@dataclass
class Header:
    """The lines at the top of every tab."""

    status: gr.Markdown
    agreement: gr.Markdown
    restart_row: gr.Row
    restart: gr.Button
    answer: gr.Markdown  # Restart's line: its answer, or why this page may not press it
    busy: gr.HTML


@dataclass
class LoadTab:
    """The Load-test tab's components: the form, its buttons, what draws live."""

    form: LoadForm
    estimate: gr.Markdown
    run: gr.Button
    demo: gr.Button
    cancel: gr.Button
    message: gr.Markdown
    live: OverTime
    per_level: PerLevel
    endpoint: EndpointForm


@dataclass
class Listed(Generic[T]):
    """The stored runs by name (what Handlers.load_runs fills): what differs between them, the rest of each, and the
    compare dropdown's choices."""

    runs: T
    details: T
    chosen: T


@dataclass
class ResultsTab:
    """The Results tab's components."""

    refresh: gr.Button
    listed: Listed
    compared: Compared


@dataclass
class Shown(Generic[T]):
    """The Environment tab's view by name: readable text and the raw dict."""

    text: T
    raw: T


@dataclass
class EnvironmentTab:
    """The Environment tab's components."""

    shown: Shown
    refresh: gr.Button


def build_app(host: Host, access: Access | None = None) -> gr.Blocks:
    """Lay out the dashboard and wire it to ``host``.

    Args:
        host: The engine host (loading or loaded).
        access: Who may command it and where endpoints may point (default: 127.0.0.1, every page the presenter).

    Returns:
        The Blocks app (not launched).
    """
    quiet_queue_analytics()
    guard = Guard(access or Access())
    ticker = Ticker(TICK_S, QUIET, Pace.for_server(TICK_S, steady=lambda session: session in guard.access.presenters))
    handlers = Handlers(host, guard)
    with LivePage(title="KV Lab") as app:
        gr.Markdown(INTRO, elem_id="intro")
        sign_in = sign_in_line(guard)
        header = _header(host, guard)
        gr.Markdown(shm_words(), elem_id="shm-warning")
        with gr.Tabs():
            load = _load_tab(host, guard)
            build_predict_tab(host, ticker, guard)  # the room predicts the next run's headline, then sees it
            build_why_tab(host, ticker, guard)
            build_capacity_tab(host, ticker, guard)
            build_kv_tab(host, ticker, guard)
            build_sweep_tab(host, ticker, guard)
            results, env = _results_tab(host, ticker), _environment_tab()
        _wire_actions(handlers, load, results, env)  # first: they claim the public API names
        header.restart.click(guard(handlers.restart, "Restarting engines"), None, [header.answer], api_name="restart",
                             **HIDDEN)
        _wire_timer(handlers, header, load, results, env, ticker)
        ticker.wire()  # one timer for every tab's groups
        for started in guard.starts:  # Cancel pressable as soon as a start is taken, not at the next tick
            started.then(handlers.buttons, None, guard.buttons(), queue=False, **QUIET)
        wire_sign_in(app, sign_in, handlers.sign_in, guard.role_outputs(sign_in) + guard.buttons())
        app.frame = _first_frame(handlers, ticker, sign_in, load)
        gr.api(handlers.run_and_wait, api_name="run_and_wait")
    return app


def _first_frame(handlers: Handlers, ticker: Ticker, sign_in: SignIn, load: LoadTab) -> FirstFrame:
    """What a page's first frame carries: every group the timer redraws for all pages, the current or last run's
    form with its estimate, and the page's role (as an unsigned page: a link with the token signs in as it
    loads)."""
    frame = FirstFrame()
    for group in ticker.shared():
        frame.add(*group)
    frame.add(handlers.form_key, handlers.form_frame, [*parts(load.form), load.estimate])
    frame.add(handlers.role_key, handlers.role_frame, handlers.guard.role_outputs(sign_in) + handlers.guard.buttons())
    return frame


def quiet_queue_analytics() -> None:
    """Gradio's queue redoes a summary of its last 10,000 events (a pandas DataFrame) after every queued event, for
    its monitoring page (13% of the page process's CPU samples with 50 viewers). Once per 1,000 events over the
    last 1,000 (read when the caller calls ``queue()``; a value set in the environment wins)."""
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "1000")
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1000")


def _header(host: Host, guard: Guard) -> Header:
    """The status line with the busy line beside it, the agreement warning, and the row of Restart dead engines
    (shown while an engine is dead) with its line: its answer, or why this page may not press it."""
    with gr.Row(equal_height=False):  # the status line and, beside it, the busy line (with the page's style)
        status = gr.Markdown(host.status_text(), elem_id="load-status")
        busy = gr.HTML(PAGE_STYLE, elem_id="busy", padding=False)
    agreement = gr.Markdown(agreement_warning(host.agreement()), elem_id="agreement-warning")
    with gr.Row(visible=False, equal_height=True, elem_id="restart-row") as row:
        restart = gr.Button("Restart dead engines", elem_id="restart", size="sm", scale=0, min_width=200)
        answer = gr.Markdown(elem_id="restart-message")
    guard.gate(COMMAND, restart)
    guard.watch(answer, "Restart dead engines", own=True, presenter_words=RESTART_HINT)
    return Header(status=status, agreement=agreement, restart_row=row, restart=restart, answer=answer, busy=busy)


def _load_tab(host: Host, guard: Guard) -> LoadTab:
    """The Load-test tab: Run, its estimate and the form on the left (Run above the fold of a 1280x720 screen), the
    story (progress, ratio and per-level bars, tok/s over time) beside it; the KV figures and latencies below. Run,
    Cancel, Workshop demo and Connect are under ``guard``'s rule, each with its note beside it."""
    with gr.Tab("Load test", id="load"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300):
                estimate = gr.Markdown(elem_id="estimate")
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="run", interactive=False)
                    cancel = gr.Button("Cancel", variant="stop", elem_id="cancel", interactive=False)
                guard.note("Run and Cancel", "run-watch")
                message = gr.Markdown(elem_id="message")
                form = _form(host.engine_names)
                demo = gr.Button("Workshop demo", elem_id="demo", interactive=False)
                guard.note("Workshop demo", "demo-watch")
                gr.Markdown(f"**Workshop demo:** {workshop_demo(host.config).why}", elem_id="demo-why")
                endpoint = _endpoint_form()
            with gr.Column(scale=3):
                live, per_level = _story_outputs(host)
        _detail_outputs(live, per_level)
    guard.gate(START, run, demo)
    guard.gate(CANCEL, cancel)
    guard.gate(COMMAND, endpoint.connect)
    guard.watch(endpoint.answer, "Connect", own=True)
    return LoadTab(form=form, estimate=estimate, run=run, demo=demo, cancel=cancel, message=message, live=live,
                   per_level=per_level, endpoint=endpoint)


def _form(engine_names: tuple[str, ...]) -> LoadForm:
    """Engines, users, workload, output length, bound, amount and repeats; open loop and SLO folded away (the
    values: DEFAULT_FORM's; a page's first frame carries the current or last run's)."""
    first = DEFAULT_FORM
    engines = gr.CheckboxGroup(engine_choices(engine_names), value=list(engine_names), label="Engines",
                               elem_id="engines")
    users = gr.Textbox(first.users, label="Concurrent users (comma list)", elem_id="users")
    workload = gr.Dropdown(list(WORKLOADS), value=first.workload, label="Workload", elem_id="workload",
                           info="tokens in → out: " + "; ".join(w.brief() for w in WORKLOADS.values()),
                           allow_custom_value=True)  # an API's unknown name: the lab's message, not Gradio's
    output_len = gr.Number(first.output_len, label="Output length in tokens (0 = the workload's)",
                           elem_id="output-len")
    bound = gr.Radio([BOUND_REQUESTS, BOUND_SECONDS], value=first.bound, label="Bound each level by",
                     elem_id="bound")
    with gr.Row():
        amount = gr.Number(first.amount, label="Requests per user / seconds", elem_id="amount", min_width=120)
        repeats = gr.Number(first.repeats, label=f"Repeats of each level (1-{MAX_REPEATS})", elem_id="repeats",
                            min_width=120)
    with gr.Accordion("Open loop and SLO (closed loop, no SLO by default)", open=False, elem_id="more-options"):
        with gr.Row():
            rate = gr.Number(first.rate, label=RATE_FIELD, elem_id="rate", min_width=120,
                             info="Poisson arrivals; users then cap what is in flight")
            slo = gr.Textbox(first.slo, label="SLO for goodput (s)", placeholder="ttft=0.5,tpot=0.05", elem_id="slo",
                             min_width=120)
    return LoadForm(engines=engines, users=users, workload=workload, output_len=output_len, bound=bound,
                    amount=amount, repeats=repeats, rate=rate, slo=slo)


def _endpoint_form() -> EndpointForm:
    """Name, URL, served model and key of an OpenAI-compatible server, the Connect button and, beside it, its
    answer (connected, or why not)."""
    with gr.Accordion("Add an endpoint: an OpenAI-compatible server (vLLM's, transformers', remote)", open=False):
        with gr.Row():
            name = gr.Textbox(ENDPOINT_ENGINE, label="Engine name", elem_id="endpoint-name", min_width=100)
            url = gr.Textbox("", label="Base URL", placeholder="http://127.0.0.1:8000", elem_id="endpoint-url",
                             min_width=200)
        with gr.Row():
            model = gr.Textbox("", label="Served model (empty: its first)", elem_id="endpoint-model", min_width=150)
            key = gr.Textbox("", label="API key (if the server needs one)", type="password", elem_id="endpoint-key",
                             min_width=150)
        with gr.Row():
            connect = gr.Button("Connect", elem_id="connect", size="sm", scale=0, min_width=100)
            answer = gr.Markdown("", elem_id="endpoint-status")
    return EndpointForm(name=name, url=url, model=model, key=key, connect=connect, answer=answer)


def _story_outputs(host: Host) -> tuple[OverTime, PerLevel]:
    """The progress line, then the story: how much faster (ratio), the speeds it divides, and how they went over
    time (the KV figures and the latency table are filled in by _detail_outputs)."""
    progress = gr.Markdown(progress_text(host.last("run")), elem_id="progress")
    with gr.Row():
        ratio = _plot("Improvement ratio vLLM/HF", "plot-ratio", "ratio")
        bars = _plot("Output tok/s per user level", "plot-bars", "bars")
    with gr.Row():
        throughput = _plot("Output tok/s over time", "plot-throughput", "throughput")
        queue = _plot("Running / waiting", "plot-queue", "queue")
    caption = gr.Markdown("", elem_id="ratio-caption")
    gr.Markdown(PEAK_NOTE, elem_id="peak-note")
    return (OverTime(progress=progress, throughput=throughput, queue=queue, vllm_kv=None, kv_tokens=None),
            PerLevel(bars=bars, ratio=ratio, latency=None, caption=caption, turns=None))


def _plot(label: str, elem_id: str, what: str) -> gr.Plot:
    """A live figure, first drawn as its empty state: what will appear there."""
    return gr.Plot(empty_figure(label, EMPTY_WORDS[what]), label=label, elem_id=elem_id)


def _detail_outputs(live: OverTime, per_level: PerLevel) -> None:
    """The KV charts and the latency table under the form and the story."""
    with gr.Row():
        live.vllm_kv = _plot("vLLM KV blocks", "plot-vllm-kv", "vllm_kv")
        live.kv_tokens = _plot("KV cache of both engines, in tokens", "plot-kv-tokens", "kv_tokens")
    per_level.latency = gr.Dataframe(pd.DataFrame(columns=LATENCY_COLUMNS), label="Latency (ms) per engine and "
                                     "user level", elem_id="latency", column_widths=LATENCY_WIDTHS, wrap=True)
    per_level.turns = _plot("TTFT per turn (chat workload)", "plot-turns", "turns")


def _results_tab(host: Host, ticker: Ticker) -> ResultsTab:
    """The Results tab: past runs (what differs between them; the rest under Details), a multi-select to
    compare them, the first one's files."""
    with gr.Tab("Results", id="results"):
        refresh = gr.Button("Refresh", size="sm")
        runs_table = gr.Dataframe(label="Past runs (stored as they finish, partial ones too): tok/s and ratio at "
                                  "the top user level measured", elem_id="runs-table", wrap=False)
        with gr.Accordion("Details of each run (id, device, model, lengths, the estimate it was given)", open=False):
            details = gr.Dataframe(elem_id="runs-details", wrap=False)
        build_searches_list(host, ticker, refresh)  # capacity searches: their capacities and ratio (lab.capacity)
        chosen = gr.Dropdown([], multiselect=True, label="Runs to compare (the first is downloadable)",
                             allow_custom_value=True)  # an id it does not list: the store's "no such run"
        with gr.Row():
            compare_plot = gr.Plot(compare_figure([]), label="tok/s compared")
            compare_ratio = gr.Plot(compare_ratio_figure([]), label="ratio compared")
        compare_table = gr.Dataframe(pd.DataFrame(columns=LATENCY_COLUMNS), label="Latency (ms) of the first chosen "
                                     "run", column_widths=LATENCY_WIDTHS, wrap=True)
        args = gr.JSON(label="Engine args of the first chosen run", elem_id="compare-args")
        with gr.Row():
            csv_file, json_file = gr.File(label="requests.csv"), gr.File(label="summary.json")
        report = gr.DownloadButton("Download report (one HTML file, opens offline)", elem_id="download-report")
    return ResultsTab(refresh=refresh, listed=Listed(runs=runs_table, details=details, chosen=chosen),
                      compared=Compared(tok_s=compare_plot, ratio=compare_ratio, latency=compare_table, args=args,
                                        requests=csv_file, summary=json_file, report=report))


def _environment_tab() -> EnvironmentTab:
    """The Environment tab: device, model, engines and the agreement check, as text and as the raw dict."""
    with gr.Tab("Environment", id="env"):
        text = gr.Markdown(elem_id="environment")
        raw = gr.JSON(label="raw")
        refresh = gr.Button("Refresh")
    return EnvironmentTab(shown=Shown(text=text, raw=raw), refresh=refresh)


def _wire_timer(handlers: Handlers, header: Header, load: LoadTab, results: ResultsTab, env: EnvironmentTab,
                ticker: Ticker) -> None:
    """Each tick writes the change keys into gr.State; a group redraws only when its own key changed (the groups
    with an input list, if only an empty one, are the page's own: its form, its message, its role's buttons)."""
    form = parts(load.form)
    groups = [
        (handlers.status_key, handlers.status_lines, [header.status, header.agreement, header.restart_row]),
        (handlers.busy_key, handlers.busy, [header.busy]),
        (handlers.live_key, handlers.live, parts(load.live)),
        (handlers.per_level_key, handlers.per_level, parts(load.per_level)),
        (handlers.runs_key, handlers.load_runs, parts(results.listed)),
        (handlers.finished_key, handlers.run_ended, [load.message], [load.message]),
        (handlers.finished_key, handlers.estimate, [load.estimate], form),  # what the run just taught
        (handlers.ready_key, handlers.environment, parts(env.shown)),
        (handlers.buttons_key, handlers.buttons, handlers.guard.buttons(), []),
    ]
    ticker.add(groups)


def _wire_actions(handlers: Handlers, load: LoadTab, results: ResultsTab, env: EnvironmentTab) -> None:
    """Buttons and the compare dropdown (with the API names the README and the tests use)."""
    guard = handlers.guard
    form = parts(load.form)
    guard.started(load.run.click(guard(handlers.start_run, "Starting a run"), form, [load.message],
                                 api_name="start_run", **HIDDEN)).then(
        handlers.progress_now, None, [load.live.progress], **QUIET)
    for component in form:
        component.change(handlers.estimate, form, [load.estimate], queue=False, **QUIET)
        component.change(handlers.form_error, [load.message, *form], [load.message], queue=False, **QUIET)
    demo = guard(handlers.demo, "Starting a run", lambda words: [gr.skip()] * len(form) + [words])  # an
    #                                                      attendee's form stays as it was
    guard.started(load.demo.click(demo, None, [*form, load.message], **QUIET)).then(
        handlers.progress_now, None, [load.live.progress], **QUIET)
    load.cancel.click(guard(handlers.cancel, "Cancelling"), None, [load.message], api_name="cancel", **HIDDEN)
    endpoint = load.endpoint
    connect = guard(handlers.connect, "Connecting an endpoint", lambda words: (words, gr.skip()))
    endpoint.connect.click(connect, endpoint.inputs(), [endpoint.answer, load.form.engines],
                           **QUIET)  # a page-only action: no API that points the host anywhere
    results.refresh.click(handlers.load_runs, None, parts(results.listed), api_name="load_runs", **HIDDEN)
    results.listed.chosen.change(handlers.compare, [results.listed.chosen], parts(results.compared),
                                 api_name="compare")
    env.refresh.click(handlers.environment, None, parts(env.shown), api_name="environment", **HIDDEN)
