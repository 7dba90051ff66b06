"""Every input, every door: each field of every form and every CLI option through the same classes of bad value.

The classes (empty, 0, negative, fraction, huge, text, unicode digits, whitespace) are generated for every field
the load-test form (plan_from_inputs), the KV and Why parameters (parse_params of every experiment), the sweep
plan (sweep_plan) and every CLI subcommand (build_parser's options, through main) take. For each, the value is
either accepted or refused with a ValueError (exit 2 on the CLI) whose message names the field; a whole-number
field never rounds a fraction and never reads empty as 0. Nothing is started: the CLI's only ways to load
(run_async, start_server) raise here. A crafted run id reaches the store as a bound parameter: "no such run".
(hypothesis is not installed in this venv, so the classes are a generated table, not a strategy.)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib

import pytest

from lab.__main__ import build_parser, main
from lab.app.dashboard import BOUND_REQUESTS, BOUND_SECONDS, plan_from_inputs
from lab.config import EngineConfig
from lab.experiments import EXPERIMENTS, module, parse_params, validate
from lab.sweeps import sweep_plan

CLASSES = {"empty": "", "zero": "0", "negative": "-3", "fraction": "1.5", "huge": "100000", "text": "abc",
           "unicode": "１", "whitespace": "   "}
NUMBERS = {"empty": None, "zero": 0.0, "negative": -3.0, "fraction": 1.5, "huge": 100000.0,
           "nan": float("nan"), "inf": float("inf")}  # what a gr.Number sends (None when cleared)
NUMBER_WORDS = ("empty", "text", "unicode", "whitespace", "nan", "inf")  # never a number, in any field

# -- the load-test form ----------------------------------------------------------------------------------------
FORM = dict(engines=["hf", "vllm"], users="1,5", workload="mixed", output_len=0, bound=BOUND_REQUESTS,
            amount=2, repeats=1, rate=0, slo="")
FORM_FIELDS = {  # field -> (the words its messages use, the classes it accepts, whether it is a number)
    "users": (("users",), (), False),
    "workload": (("workload",), (), False),
    "output_len": (("output length", "output_len"), ("zero",), True),
    "requests": (("requests per user",), (), True),
    "seconds": (("seconds per level", "duration_s"), ("fraction",), True),
    "repeats": (("repeats",), (), True),
    "rate": (("rate", "requests/s"), ("zero", "fraction"), True),
    "slo": (("slo",), ("empty", "whitespace"), False),
    "engines": (("engine",), (), False),
}


def form_with(name: str, value) -> dict:
    """The usual form with one field changed (requests and seconds: the amount under that bound)."""
    values = dict(FORM)
    if name in ("requests", "seconds"):
        values.update(bound=BOUND_REQUESTS if name == "requests" else BOUND_SECONDS, amount=value)
    elif name == "engines":
        values["engines"] = [value] if value else []
    else:
        values[name] = value
    return values


def refusal(call) -> str | None:
    """The ValueError message ``call`` raises, or None when it accepts."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


def assert_named(message: str | None, names, accepted: bool, where: str) -> None:
    """Accepted where the table says so; else refused with a message that names the field."""
    if accepted:
        assert message is None, f"{where}: refused a good value: {message}"
        return
    assert message is not None, f"{where}: accepted"
    assert any(n.lower() in message.lower() for n in names), f"{where}: {message!r} names none of {names}"


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("field", FORM_FIELDS)
def test_every_form_field_typed_as_text(field, kind):
    names, good, _ = FORM_FIELDS[field]
    values = form_with(field, CLASSES[kind])
    message = refusal(lambda: plan_from_inputs(EngineConfig(), **values))
    assert_named(message, names, kind in good, f"{field}={CLASSES[kind]!r}")


@pytest.mark.parametrize("kind", NUMBERS)
@pytest.mark.parametrize("field", [f for f, (_, _, number) in FORM_FIELDS.items() if number])
def test_every_number_field_as_the_page_sends_it(field, kind):
    names, good, _ = FORM_FIELDS[field]
    values = form_with(field, NUMBERS[kind])
    message = refusal(lambda: plan_from_inputs(EngineConfig(), **values))
    assert_named(message, names, kind in good, f"{field}={NUMBERS[kind]!r}")


def test_a_fraction_is_never_rounded_and_empty_is_never_zero():
    for field in ("output_len", "requests", "repeats"):
        assert "whole number" in refusal(lambda f=field: plan_from_inputs(EngineConfig(), **form_with(f, 1.5)))
        assert "nothing" in refusal(lambda f=field: plan_from_inputs(EngineConfig(), **form_with(f, None)))
    plan = plan_from_inputs(EngineConfig(), **form_with("repeats", 2.0))  # a whole float is that whole number
    assert plan.load.repeats == 2


class NoStartHost:
    """A host whose every start fails the test: the page's handler must refuse before it."""

    config = EngineConfig()

    def submit(self, plan):
        raise AssertionError(f"started {plan}")


@pytest.mark.parametrize("kind", NUMBERS)
def test_the_page_handler_shows_the_labs_words_and_starts_nothing(kind):
    from lab.app.ui import Handlers

    values = form_with("repeats", NUMBERS[kind])
    answer = Handlers(NoStartHost()).start_run(*values.values())
    assert answer.startswith("**Input error:** Repeats")


# -- the KV cache and Why parameters ---------------------------------------------------------------------------
PARAMS = [(name, f.name, str(f.type)) for name in EXPERIMENTS for f in dataclasses.fields(module(name).Params)]
CONFIG = EngineConfig(device="cpu", max_model_len=2048)


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("experiment, field, annotation", PARAMS)
def test_every_experiment_parameter(experiment, field, annotation, kind):
    value = CLASSES[kind]
    message = refusal(lambda: validate(experiment, parse_params(experiment, {field: value}), CONFIG))
    if kind == "empty":  # the parameter's stated default
        assert message is None, message
        return
    numeric = annotation.split()[0].startswith(("int", "float", "tuple"))
    if message is None:
        assert not (numeric and kind in ("text", "unicode", "whitespace")), f"{experiment} {field}={value!r} accepted"
        assert not (numeric and "float" not in annotation and kind == "fraction"), f"{field}=1.5 accepted (rounded?)"
        return
    short = field.replace("decode_", "")
    names = (field, short, short.replace("_", " "), field.rstrip("s"))  # 'unknown rung' names rungs
    assert_named(message, names, False, f"{experiment} {field}={value!r}")


# -- the sweep form and flags ----------------------------------------------------------------------------------
SWEEP = dict(knob="hf_max_batch_size", values="1,2", users="5", workload="mixed", requests_per_user=2, output_len=0)
SWEEP_FIELDS = {"knob": (("knob",), ()), "values": (("hf_max_batch_size",), ()), "users": (("users",), ()),
                "workload": (("workload",), ()), "requests_per_user": (("requests per user",), ()),
                "output_len": (("output length", "output_len"), ("zero",))}


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("field", SWEEP_FIELDS)
def test_every_sweep_field(field, kind):
    names, good = SWEEP_FIELDS[field]
    message = refusal(lambda: sweep_plan(**{**SWEEP, field: CLASSES[kind]}).configs(CONFIG))  # lengths too
    assert_named(message, names, kind in good, f"sweep {field}={CLASSES[kind]!r}")


def test_a_sweep_value_past_the_batch_limit_is_refused_with_the_reason():
    message = refusal(lambda: sweep_plan("hf_max_batch_size", "4,100000"))
    assert "hf_max_batch_size 100000 is past the limit of 256" in message and "never fills" in message


# -- every CLI subcommand's options ----------------------------------------------------------------------------
SKIPPED = {"--out", "--model", "--served-model-name", "--api-key", "--app", "-h"}  # free text or a path/hub id
ALIASES = {"--param": ("key=value", "unknown parameter", "experiment"), "--engines": ("engine",),
           "name": ("experiment",), "knob": ("knob",), "--values": ("max_num_seqs",), "--rungs": ("rung",),
           "--base-url": ("endpoint URL",), "--endpoint": ("endpoint",),
           "--duration": ("seconds per level",)}  # the page's name too (the CLI's help: seconds per level)
REQUIRED = {"experiment": ["waste"], "sweep": ["max_num_seqs", "--values", "1,4"], "explain": [], "bench": [],
            "check": [], "env": [], "serve": [], "capacity": ["--slo", "ttft_p95=2s"]}


def cli_options() -> list[tuple[str, str]]:
    """(subcommand, option) for every option of every subcommand that takes a value."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for command, subparser in sub.choices.items():
        for action in subparser._actions:
            if action.nargs == 0 or not (action.option_strings or command in ("experiment", "sweep")):
                continue
            option = action.option_strings[0] if action.option_strings else action.dest
            if option not in SKIPPED:
                found.append((command, option))
    return found


class Started(Exception):
    """Raised where the CLI would load an engine or start a server."""


@pytest.fixture
def nothing_starts(monkeypatch):
    def refuse(*args, **kwargs):
        for arg in args:
            getattr(arg, "close", lambda: None)()  # the coroutine it was handed: never awaited
        raise Started

    monkeypatch.setattr("lab.session.run_async", refuse)
    monkeypatch.setattr("lab.serve.start_server", refuse)


def cli_argv(command: str, option: str, value: str) -> list[str]:
    """The subcommand's required arguments with one option (or positional) set to ``value``."""
    required = list(REQUIRED[command])
    if option in ("name", "knob"):
        required[0] = value
        return [command, *required]
    return [command, *required, f"{option}={value}"]


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("command, option", cli_options())
def test_every_cli_option(command, option, kind, nothing_starts, capsys):
    value = CLASSES[kind]
    try:
        code = main(cli_argv(command, option, value))
    except Started:
        return  # accepted: it got as far as starting, which the fixture stopped
    except SystemExit as exc:  # argparse's own refusal (type or choice)
        code = exc.code
    err = capsys.readouterr().err
    if code == 0:
        return  # env printed its JSON; nothing loaded
    assert code == 2, err
    assert "starting engine" not in err.lower()
    dest = option.lstrip("-")
    names = (option, dest, dest.replace("-", "_"), dest.replace("-", " "), *ALIASES.get(option, ()))
    assert any(n.lower() in err.lower() for n in names), f"{command} {option}={value!r}: {err!r}"


@pytest.mark.parametrize("command, option", [(c, o) for c, o in cli_options()
                                             if o in ("--repeats", "--requests-per-user", "--output-len")])
def test_a_cli_fraction_is_refused_not_rounded(command, option, nothing_starts, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(cli_argv(command, option, "1.5"))
    assert exit_.value.code == 2 and "whole number" in capsys.readouterr().err


# -- identifiers that reach the store --------------------------------------------------------------------------
CRAFTED = ["../x", "../../results.sqlite", "/etc/passwd", "' or 1=1 --", "x'; drop table runs; --", "..", "\x00"]


@pytest.mark.parametrize("run_id", CRAFTED)
def test_a_crafted_run_id_is_no_such_run_and_touches_nothing(run_id, tmp_path, monkeypatch):
    from lab.store import connect, export_run, load_summary

    db = tmp_path / "store" / "results.sqlite"
    connect(db).close()
    before = hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    for call in (lambda: load_summary(db, run_id), lambda: export_run(db, run_id, tmp_path / "out" / run_id)):
        with pytest.raises(KeyError, match="no such run"):
            call()
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in tmp_path.rglob("*"))) == before


def test_a_crafted_run_id_through_the_page_api_says_no_such_run(tmp_path):
    import gradio as gr

    from lab.app.ui import Handlers

    host = type("Host", (), {"db_path": tmp_path / "results.sqlite"})()
    with pytest.raises(gr.Error, match="no such run"):
        Handlers(host).compare(["../x"])


def test_bounds_the_issue_lists():
    from lab.config import LoadConfig

    assert "past the limit of 8" in refusal(lambda: sweep_plan("max_num_seqs", "1,2,3,4,5,6,7,8,9"))
    assert "from 0 to 2048" in refusal(lambda: LoadConfig(warmup_requests=100000))
    assert "1 to 10, not 11" in refusal(lambda: plan_from_inputs(EngineConfig(), **form_with("repeats", 11)))
    assert "give 0 for a closed loop" in refusal(lambda: plan_from_inputs(EngineConfig(), **form_with("rate", -3)))


@pytest.mark.parametrize("port", ["-3", "100000"])
def test_serve_refuses_a_port_outside_tcp(port, nothing_starts, capsys):
    assert main(["serve", "--port", port]) == 2
    assert "--port must be from 0 (any free one) to 65535" in capsys.readouterr().err


# -- the endpoint form (Load test tab): name and URL through the page's own handler ------------------------------
NAME_OK = {"empty", "whitespace", "zero", "fraction", "huge", "text"}  # an empty name is the stated default, openai


@pytest.mark.parametrize("kind", CLASSES)
@pytest.mark.parametrize("field, names", [("url", ("endpoint URL",)), ("name", ("endpoint name",))])
def test_every_endpoint_field(field, names, kind):
    from lab.app.ui import Handlers

    class Host:  # what reaches it passed the form's rules; nothing is connected here
        def connect_endpoint(self, endpoint):
            return False, f"not tried: {endpoint.name}"

    typed = {"url": "http://127.0.0.1:9", "name": "", field: CLASSES[kind]}
    answer, _ = Handlers(Host()).connect(typed["name"], typed["url"], "", "")
    if field == "name" and kind in NAME_OK:
        assert answer.startswith("**Not connected:** not tried"), answer
    else:
        assert answer.startswith("**Input error:**") and any(n in answer for n in names), answer
