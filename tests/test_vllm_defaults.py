"""vLLM's step caps as `vllm serve` sets them (issue #41 part 1): the lab asks vLLM for max_num_batched_tokens and
max_num_seqs, a value the user set wins, the engine args say where each came from, and every command takes
--max-num-batched-tokens. No engine starts: the reference is vLLM's own EngineArgs.create_engine_config for its
OpenAI server (UsageContext.OPENAI_API_SERVER), which reads only the embedded model's config. The engine args of
started engines are checked in tests/test_engines.py (test_vllms_step_caps_are_vllm_serves_and_say_where_from).
"""

from __future__ import annotations

import pytest

from lab.__main__ import build_parser, main
from lab.config import EngineConfig
from lab.engines.vllm import engine_kwargs
from lab.engines.vllm_caps import STEP_CAPS, batch_limits, batch_sources
from lab.model import resolve_model
from lab.options import engine_config_from

DEFAULT = "vllm serve's default on this CPU"


def vllm_serve_gives(config: EngineConfig) -> dict:
    """The two caps vLLM's own EngineArgs settles on for its OpenAI server, given the lab's other args and only the
    caps the user set (the rest left to vLLM, as `vllm serve` leaves them)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    unset = config.with_overrides(max_num_seqs=None, max_num_batched_tokens=None)  # the lab's other args
    kwargs = engine_kwargs(unset, resolve_model(None)) | {name: getattr(config, name) for name in STEP_CAPS}
    kwargs.pop("distributed_executor_backend", None)  # the executor is no part of the caps
    scheduler = EngineArgs(**kwargs).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER).scheduler_config
    return {name: getattr(scheduler, name) for name in STEP_CAPS}


@pytest.mark.parametrize("changes", [
    {},  # vLLM's defaults on this CPU
    {"max_model_len": 1024},
    {"max_num_seqs": 1, "max_model_len": 1024},  # vLLM bounds a default token cap by the sequences it can hold
    {"max_num_batched_tokens": 64},  # ... and a default sequence cap by the token cap
    {"max_num_seqs": 4, "max_num_batched_tokens": 512},  # both set: both win
])
def test_the_step_caps_are_what_vllm_gives_its_openai_server(changes):
    config = EngineConfig(device="cpu", **changes)
    assert batch_limits(config) == vllm_serve_gives(config)


def test_a_value_the_user_sets_wins_and_reaches_every_face():
    from lab.serve import vllm_command

    config = EngineConfig(device="cpu", max_num_seqs=4, max_num_batched_tokens=512)
    kwargs = engine_kwargs(config, "m")  # the served, step-loop and offline faces all start from these
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (4, 512)
    command = vllm_command(config, "m", 8000)  # lab serve
    assert command[command.index("--max-num-seqs") + 1] == "4"
    assert command[command.index("--max-num-batched-tokens") + 1] == "512"


def test_the_source_says_set_or_vllm_serves_default_here():
    assert batch_sources(EngineConfig(device="cpu")) == {"max_num_batched_tokens": DEFAULT, "max_num_seqs": DEFAULT}
    assert batch_sources(EngineConfig(device="cpu", max_num_seqs=4)) == {"max_num_batched_tokens": DEFAULT,
                                                                         "max_num_seqs": "set"}


@pytest.mark.parametrize("changes, words", [
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be at least 1, not 0"),
    ({"max_num_batched_tokens": -3}, "max_num_batched_tokens must be at least 1, not -3"),
    ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens must be a whole number, not 1.5"),
    ({"max_num_seqs": 0}, "max_num_seqs must be at least 1, not 0"),
    ({"max_num_seqs": 8, "max_num_batched_tokens": 4}, "max_num_batched_tokens 4 is below max_num_seqs 8"),
])
def test_a_bad_cap_is_refused_with_the_value_and_the_limit(changes, words):
    with pytest.raises(ValueError, match="must be|is below") as refusal:
        EngineConfig(**changes)
    assert words in str(refusal.value) and ("unset" in str(refusal.value) or "at most" in str(refusal.value))


def test_a_set_sequence_cap_past_vllms_default_token_cap_is_refused_as_vllm_refuses_it():
    config = EngineConfig(device="cpu", max_num_seqs=100000)
    with pytest.raises(ValueError) as refusal:
        batch_limits(config)
    tokens = vllm_serve_gives(EngineConfig(device="cpu"))["max_num_batched_tokens"]
    assert f"max_num_batched_tokens {tokens} ({DEFAULT}) is below max_num_seqs 100000" in str(refusal.value)
    with pytest.raises(ValueError, match="greater than or equal to max_num_seqs"):
        vllm_serve_gives(config)  # vLLM's own refusal of the same caps


def test_the_cli_option_parses_and_defaults_to_vllm_serves():
    args = build_parser().parse_args(["bench", "--max-num-batched-tokens", "4096"])
    assert engine_config_from(args).max_num_batched_tokens == 4096
    assert engine_config_from(build_parser().parse_args(["bench"])).max_num_batched_tokens is None


@pytest.mark.parametrize("argv, message", [
    (["bench", "--max-num-batched-tokens", "1.5"], "give a whole number, not '1.5'"),
    (["bench", "--max-num-batched-tokens", "abc"], "give a whole number, not 'abc'"),
    (["bench", "--max-num-batched-tokens=-3"], "max_num_batched_tokens must be at least 1, not -3"),
    (["check", "--max-num-batched-tokens", "0"], "max_num_batched_tokens must be at least 1, not 0"),
    (["bench", "--max-num-seqs", "8", "--max-num-batched-tokens", "4"], "max_num_batched_tokens 4 is below"),
])
def test_a_bad_cli_value_exits_2_naming_it(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("lab.session.run_async", lambda *a, **k: pytest.fail("the CLI started an engine"))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and ("--max-num-batched-tokens" in err or "max_num_batched_tokens" in err), err
