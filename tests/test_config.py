"""Bad input is rejected before anything loads, with the reason."""

import re

import pytest

from lab.__main__ import main
from lab.config import Endpoint, EngineConfig, LoadConfig, RunPlan, parse_endpoint, parse_users
from lab.environment import GIB, DeviceInfo
from lab.memory import plan_memory
from lab.model import resolve_model


@pytest.mark.parametrize("text, message", [
    ("", "at least one"), ("0", ">= 1"), ("1,-5", ">= 1"), ("two", "not a whole number"),
])
def test_bad_user_lists(text, message):
    with pytest.raises(ValueError, match=message):
        parse_users(text)


def test_users_parse():
    assert parse_users("1, 5 10,20") == (1, 5, 10, 20)


def test_load_config_rejects_bad_values():
    with pytest.raises(ValueError, match=">= 1"):
        LoadConfig(users=(0,))
    with pytest.raises(ValueError, match="unknown workload"):
        LoadConfig(workload="chatter")
    with pytest.raises(ValueError, match="exactly one"):
        LoadConfig(requests_per_user=None, duration_s=None)
    with pytest.raises(ValueError, match="output_len"):
        LoadConfig(output_len=0)


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        RunPlan(engines=("hf", "tgi"))


def test_missing_model_path():
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model("/no/such/model")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model("./relative/missing")
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_engine_config_rejects_impossible_fraction_and_block_size():
    with pytest.raises(ValueError, match="fraction of total"):
        EngineConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="multiple of 32"):
        EngineConfig(device="cpu", block_size=16).check_block_size()


def gpu(total_gib=80, free_gib=80):
    return DeviceInfo("cuda", "H100", int(total_gib * GIB), int(free_gib * GIB), 16, "test")


def test_memory_plan_fraction_is_of_total_not_free():
    # the seeds' shared-card gotcha: 0.85 of 90 GB when only 64 GB are free
    with pytest.raises(ValueError, match="TOTAL.*only 64.00 GiB.*<= 0.7"):
        plan_memory(EngineConfig(device="cuda", gpu_memory_utilization=0.85), gpu(90, 64), ("vllm",),
                    16 * GIB, 131072)
    plan = plan_memory(EngineConfig(device="cuda", gpu_memory_utilization=0.5), gpu(), ("hf", "vllm"),
                       16 * GIB, 131072)
    assert plan.shares == {"vllm": 40 * GIB, "hf": 16 * GIB}


def test_the_memory_plan_holds_the_pool_vllm_is_given_on_cuda_not_its_whole_share():
    from lab.engines.vllm import engine_kwargs

    plan = plan_memory(EngineConfig(device="cuda"), gpu(), ("hf", "vllm"), GIB, 23040)
    blocks = engine_kwargs(EngineConfig(device="cuda"), "m")["num_gpu_blocks_override"]  # the demo-sized pool
    assert plan.pool_kv_tokens == blocks * 16 and plan.pool_kv_bytes == blocks * 16 * 23040
    assert any(f"{blocks:,} blocks of 16 tokens" in note for note in plan.notes)


def test_memory_plan_leaves_room_for_hf():
    with pytest.raises(ValueError, match="HF model needs"):
        plan_memory(EngineConfig(device="cuda", gpu_memory_utilization=0.95), gpu(), ("hf", "vllm"),
                    16 * GIB, 131072)
    with pytest.raises(ValueError, match="does not even hold"):
        plan_memory(EngineConfig(device="cuda", gpu_memory_utilization=0.1), gpu(), ("vllm",), 16 * GIB, None)


def test_a_kv_budget_must_hold_one_request_of_max_model_len():
    # vLLM refuses to start on a smaller pool, after its imports: the lab says so before anything loads
    with pytest.raises(ValueError, match=r"kv_cache_gib=0.01 holds 29 blocks of block_size=16 tokens, fewer than one "
                                         r"request of max_model_len=2048 needs .* \(129\): use kv_cache_gib >= 0.045"):
        plan_memory(EngineConfig(device="cuda", kv_cache_gib=0.01), gpu(), ("vllm",), GIB, 23040)
    plan = plan_memory(EngineConfig(device="cuda", kv_cache_gib=0.05), gpu(), ("vllm",), GIB, 23040)
    assert plan.pool_kv_tokens == 2330


def test_max_model_len_stays_within_the_models_own(tmp_path):
    from lab.memory import check_model_len

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 8192}')
    with pytest.raises(ValueError, match="max_model_len=100000 is longer than this model's 8192 tokens.*<= 8192"):
        check_model_len(EngineConfig(max_model_len=100000), str(tmp_path))
    check_model_len(EngineConfig(max_model_len=8192), str(tmp_path))


def test_memory_plan_counts_hf_continuous_batching_apart():
    cpu = DeviceInfo("cpu", "CPU", 24 * GIB, 20 * GIB, 2, "test")
    per_token = 23040  # SmolLM2-135M in bf16
    plan = plan_memory(EngineConfig(device="cpu", dtype="bfloat16"), cpu, ("hf", "vllm", "hf-cb"), GIB // 4,
                       per_token)
    mask = 4096 * (GIB // 4 // per_token + 4096) * 2  # SDPA's mask: max_batch_tokens x (KV tokens + them), bf16
    assert plan.shares["hf-cb"] == GIB // 4 + GIB // 4 + mask  # its own weights + vLLM's KV budget (0.25 GiB) + mask
    assert any(note.startswith("HF-CB: 0.25 GiB of weights (its own copy) + 0.25 GiB of paged KV + 0.12 GiB of "
                               "attention mask") for note in plan.notes)
    with pytest.raises(ValueError, match="HF-CB needs 9.09 GiB"):
        plan_memory(EngineConfig(device="cuda", kv_cache_gib=1), gpu(80, 20), ("hf", "vllm", "hf-cb"), 8 * GIB,
                    131072)


def test_a_folder_without_weights_is_planned_from_its_config_shapes(tmp_path):
    from lab.model import weights_bytes

    llama8b = {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(__import__("json").dumps(llama8b))
    assert weights_bytes(str(tmp_path)) == 8_030_261_248 * 2  # Llama-3.1-8B's 8.03 B parameters in bf16


def test_memory_plan_on_cpu_checks_ram():
    cpu = DeviceInfo("cpu", "CPU", 24 * GIB, 20 * GIB, 2, "test")
    with pytest.raises(ValueError, match="lower kv_cache_gib"):
        plan_memory(EngineConfig(device="cpu", kv_cache_gib=64), cpu, ("hf", "vllm"), GIB // 4, 1000)


@pytest.mark.parametrize("argv, message", [
    (["bench", "--users", "0"], ">= 1"),
    (["bench", "--users", ""], "at least one"),
    (["bench", "--engines", "hf,tgi"], "unknown engine"),
    (["bench", "--workload", "chatter"], "unknown workload"),
    (["bench", "--model", "/no/such/dir"], "does not exist"),
    (["bench", "--device", "cpu", "--kv-cache-gib", "4096"], "lower kv_cache_gib"),
    (["bench", "--device", "cpu", "--block-size", "16"], "multiple of 32"),
    (["bench", "--output-len", "5000", "--users", "1"], "5000 tokens"),
    (["bench", "--workload", "prefill", "--max-model-len", "1024"], "max_model_len 1024"),
    (["bench", "--cpu-attention", "avx"], "invalid choice"),
    (["bench", "--repeats", "0"], "repeats must be a whole number from 1 to 10, not 0"),
    (["bench", "--users", "100000"], "100000 is past the limit of 256 concurrent users per level"),
    (["bench", "--users", "300", "--max-users", "512", "--requests-per-user", "10"], "3000 requests, past"),
    (["check", "--engines", "hf"], "two engines"),
    (["check", "--device", "cpu", "--block-size", "16"], "multiple of 32"),
])
def test_cli_rejects_bad_input_before_loading(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_output_length_wall_names_both_lengths_in_one_place():
    with pytest.raises(ValueError, match=r"output_len 5000 tokens .* max_model_len 2048: use .* at most 1536"):
        RunPlan(load=LoadConfig(output_len=5000))
    RunPlan(load=LoadConfig(output_len=1536))  # 512-token prompts + 1536 fits 2048 exactly


def test_kv_fit_warning_names_the_level_and_the_pool():
    from lab.memory import MemoryPlan, kv_fit_warning

    cpu = DeviceInfo("cpu", "CPU", 24 * GIB, 20 * GIB, 2, "test")
    memory = MemoryPlan(cpu, None, pool_kv_tokens=10_000)
    plan = RunPlan(load=LoadConfig(users=(1, 20), workload="decode"))
    assert "at 20 users" in kv_fit_warning(plan, memory) and "10,000" in kv_fit_warning(plan, memory)
    assert kv_fit_warning(RunPlan(load=LoadConfig(users=(1,), workload="decode")), memory) is None


@pytest.mark.parametrize("choice, amx, dtype, expected", [
    ("auto", True, "bfloat16", "vec"), ("auto", False, "bfloat16", None), ("auto", True, "float32", None),
    ("amx", True, "bfloat16", None), ("vec", False, "bfloat16", "vec"),
])
def test_cpu_attention_avoids_amx_only_where_it_gave_wrong_text(monkeypatch, choice, amx, dtype, expected):
    monkeypatch.setattr("lab.environment.has_amx", lambda: amx)
    config = EngineConfig(device="cpu", dtype=dtype, cpu_attention=choice)
    assert config.vllm_cpu_attention_isa() == expected
    assert EngineConfig(device="cuda", cpu_attention=choice).vllm_cpu_attention_isa() is None


def test_load_status_counts_steps_done():
    from lab.app.host import LoadStatus

    status = LoadStatus(total_steps=3)
    status.steps += ["loading tokenizer", "starting engine 1/2: vllm"]
    text = status.text()
    assert text.startswith("Loading (1/3 steps done, ") and text.endswith(" s so far): starting engine 1/2: vllm")
    status.steps.append("starting engine 2/2: hf")
    assert status.text().startswith("Loading (2/3 steps done, ")
    status.ready = True
    assert status.text() == "Engines ready."


def test_work_is_bounded_and_the_cli_can_raise_the_bounds():
    with pytest.raises(ValueError, match="lab bench --max-users"):
        LoadConfig(users=(1, 100000))
    with pytest.raises(ValueError, match="256 users x 10 requests per user = 2560 requests"):
        LoadConfig(users=(256,), requests_per_user=10)
    assert LoadConfig(users=(1000,), requests_per_user=1, max_users=1000).users == (1000,)
    assert LoadConfig(users=(256,), requests_per_user=None, duration_s=30).users == (256,)  # no count to bound


def test_cuda_block_sizes_are_the_backends_16_or_32():
    EngineConfig(device="cuda", block_size=32).check_block_size()
    EngineConfig(device="cuda").check_block_size()  # the default, 16
    with pytest.raises(ValueError, match="on CUDA the lab runs vLLM with blocks of 16 or 32 tokens"):
        EngineConfig(device="cuda", block_size=64).check_block_size()


def test_an_engine_out_of_memory_names_what_it_asked_for_and_what_was_free():
    from lab.engines.failures import asked_bytes, failure_words

    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 3221225472 bytes. "
                       "Error code 12 (Cannot allocate memory)")
    assert asked_bytes(str(cpu)) == 3 * GIB
    assert asked_bytes("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ...") == 2 * GIB
    words = failure_words("HF", cpu, "cpu", 32)
    assert words.startswith("HF ran out of memory on cpu with a batch of 32 requests: it asked for 3.00 GiB and ")
    assert "GiB was free" in words
    assert failure_words("HF", ValueError("bad shape"), "cpu", 2) == (
        "HF failed a batch of 2 requests: ValueError: bad shape")


def test_an_engine_process_exit_in_words():
    from lab.engines.vllm import exit_words

    assert exit_words(-9) == "signal 9, SIGKILL" and exit_words(1) == "exit code 1"


def test_endpoints_join_the_engine_names_and_keep_their_key_out_of_sight():
    from lab.config import Endpoint, parse_endpoint

    endpoint = parse_endpoint("tuned=http://127.0.0.1:9000", model="m", api_key="sk-secret")
    assert (endpoint.name, endpoint.base_url, endpoint.model) == ("tuned", "http://127.0.0.1:9000", "m")
    assert "sk-secret" not in repr(endpoint) and "sk-secret" not in str(endpoint.public())
    config = EngineConfig(endpoints=(parse_endpoint("http://127.0.0.1:8000"), endpoint))
    plan = RunPlan(engines=("openai", "tuned"), engine=config)
    assert plan.engines == ("openai", "tuned")
    with pytest.raises(ValueError, match="needs --base-url"):
        RunPlan(engines=("hf", "openai"))
    with pytest.raises(ValueError, match="http:// or https://"):
        Endpoint(base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="other than the in-process engines"):
        Endpoint(base_url="http://x", name="vllm")
    with pytest.raises(ValueError, match="no user or password"):
        parse_endpoint("https://me:secret@host.example")
    with pytest.raises(ValueError, match="different name"):
        EngineConfig(endpoints=(parse_endpoint("http://a"), parse_endpoint("http://b")))


def test_open_loop_and_slo_settings_are_checked_before_anything_loads():
    from lab.config import parse_slo

    assert parse_slo("ttft=0.5, tpot=0.05") == (("ttft", 0.5), ("tpot", 0.05)) and parse_slo("") == ()
    for text, words in (("ttft", "not NAME=SECONDS"), ("ttft=fast", "not a number")):
        with pytest.raises(ValueError, match=words):
            parse_slo(text)
    for kwargs, words in (({"rate": 0}, "rate must be above 0"), ({"arrival": "burst"}, "arrival must be one of"),
                          ({"burstiness": 0}, "burstiness must be positive"),
                          ({"slo": (("latency", 1.0),)}, "unknown metric 'latency'"),
                          ({"slo": (("ttft", -1.0),)}, "positive number of seconds"),
                          ({"rate": 100.0, "duration_s": 60.0, "requests_per_user": None}, "6000 requests, past")):
        with pytest.raises(ValueError, match=words):
            LoadConfig(**kwargs)


@pytest.mark.parametrize("flags, device, expected", [
    ({"avx2", "avx512_bf16"}, "cpu", "bfloat16"), ({"avx2", "amx_bf16", "amx_tile"}, "cpu", "bfloat16"),
    ({"avx2", "fma"}, "cpu", "float32"), (set(), "cpu", "bfloat16"), ({"avx2"}, "cuda", "bfloat16"),
])
def test_auto_dtype_is_bf16_unless_the_cpu_only_emulates_it(monkeypatch, flags, device, expected):
    from lab import environment

    monkeypatch.setattr(environment, "cpu_flags", lambda: frozenset(flags))
    assert EngineConfig(device=device).resolved_dtype() == expected
    assert EngineConfig(device=device, dtype="float16").resolved_dtype() == "float16"  # a choice is kept
    with pytest.raises(ValueError, match="dtype must be auto, bfloat16, float16 or float32, not 'fp8'"):
        EngineConfig(dtype="fp8")


@pytest.mark.parametrize("value, expected", [(2, 2), (2.0, 2), ("2", 2), (" 7 ", 7), ("-3", -3)])
def test_whole_takes_whole_numbers_in_every_shape(value, expected):
    from lab.config import whole

    assert whole(value, "Repeats") == expected


@pytest.mark.parametrize("value, words", [
    (None, "not nothing"), ("", "not nothing"), ("  ", "not nothing"), (1.5, "not 1.5"), ("1.5", "not '1.5'"),
    ("x", "not 'x'"), ("１", "not '１'"), (True, "not True"), (float("nan"), "not nan"), (0, "not 0"),
    (11, "not 11"),
])
def test_whole_refuses_by_name_without_rounding(value, words):
    from lab.config import whole

    with pytest.raises(ValueError, match=f"^Repeats: give a whole number from 1 to 10, {re.escape(words)}$"):
        whole(value, "Repeats", 1, 10)


@pytest.mark.parametrize("value", ["", "nan", "inf", "-inf", "1,5", "x", None, float("inf")])
def test_decimal_refuses_what_is_not_a_finite_number(value):
    from lab.config import decimal

    with pytest.raises(ValueError, match="^Rate: give a"):
        decimal(value, "Rate")
    assert decimal("1e3", "Rate") == 1000.0 and decimal(" .5 ", "Rate") == 0.5


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"])
def test_an_endpoint_url_is_taken_with_or_without_v1(url):
    assert Endpoint(base_url=url).base_url == "http://h:8000"
    assert parse_endpoint(f"tuned={url}").base_url == "http://h:8000"


def test_a_url_with_a_password_is_refused_in_words_for_the_page_and_the_cli():
    with pytest.raises(ValueError, match="API key field \\(--api-key on the CLI\\)"):
        Endpoint(base_url="http://user:pw@h:8000")


def test_seconds_per_level_are_bounded_by_an_hour_with_the_runs_length():
    from lab.config import MAX_LEVEL_S

    LoadConfig(requests_per_user=None, duration_s=MAX_LEVEL_S)
    with pytest.raises(ValueError, match=r"at most 3600 \(an hour\), not 100000 \(about 111 h 6 min per engine\)"):
        LoadConfig(requests_per_user=None, duration_s=100000)  # 4 default levels
    with pytest.raises(ValueError, match=r"Seconds per level .* not -3$"):
        LoadConfig(requests_per_user=None, duration_s=-3)


def test_hf_max_batch_size_is_bounded_by_the_most_users_with_the_reason():
    EngineConfig(hf_max_batch_size=256)
    with pytest.raises(ValueError, match="hf_max_batch_size 100000 is past the limit of 256: .* never fills"):
        EngineConfig(hf_max_batch_size=100000)


@pytest.mark.parametrize("seconds, words", [(45, "45 s"), (400, "6 min 40 s"), (3600, "1 h"), (400000, "111 h 6 min"),
                                            (120, "2 min")])
def test_duration_words_scale_their_unit(seconds, words):
    from lab.config import duration_words

    assert duration_words(seconds) == words


def test_users_refuse_digits_of_other_scripts():
    with pytest.raises(ValueError, match="users: '１' is not a whole number"):
        parse_users("1,１")


def test_on_cuda_vllms_default_pool_is_the_workshop_demos_top_level():
    """64 users x (264 + 136) mean tokens of `mixed` = 25,600 token slots, 1,600 blocks of 16 (computed); a KV budget
    or a block count given by the user wins, and a CPU keeps its KV budget."""
    from lab.engines.vllm import engine_kwargs

    assert engine_kwargs(EngineConfig(device="cuda"), "m")["num_gpu_blocks_override"] == 1600
    assert engine_kwargs(EngineConfig(device="cuda", block_size=32), "m")["num_gpu_blocks_override"] == 800
    assert engine_kwargs(EngineConfig(device="cuda", num_kv_blocks=7), "m")["num_gpu_blocks_override"] == 7
    assert "num_gpu_blocks_override" not in engine_kwargs(EngineConfig(device="cuda", kv_cache_gib=2), "m")
    assert "num_gpu_blocks_override" not in engine_kwargs(EngineConfig(device="cpu"), "m")


@pytest.mark.parametrize("visible, index, expect", [
    (None, 1, "host-1"), ("1", 0, "host-1"), ("GPU-b,0", 0, "uuid-GPU-b"), ("0,1", 1, "host-1"), ("1", 1, None),
    ("", 0, None), ("GPU-3a", 0, None)])
def test_the_gpu_read_is_the_one_cuda_visible_devices_names(monkeypatch, visible, index, expect):
    """NVML counts the host's GPUs; torch's index counts those CUDA_VISIBLE_DEVICES names (a job on GPU 1 of a
    two-GPU host read GPU 0's memory and processes)."""
    import sys
    import types

    from lab import environment

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"host-{i}",
        nvmlDeviceGetHandleByUUID=lambda u: 1 / 0 if u == "GPU-3a" else f"uuid-{u}",  # a prefix NVML refuses
        nvmlDeviceGetName=lambda h: h, nvmlSystemGetDriverVersion=lambda: "1",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=2, free=1, used=1),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    found = environment.read_gpu(index)
    assert (found.name if found else None) == expect
