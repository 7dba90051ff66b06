#!/usr/bin/env bash
# vLLM's faces and the contenders on a lent NVIDIA GPU without network (see ../shared/gpu/README.md):
# offline LLM.generate vs the lab's vllm-engine (step loop) vs vllm (AsyncLLM streaming) vs a bare AsyncLLM
# client taking turns, 64 requests at once of OUTPUT_LEN (512) tokens, ROUNDS (8) rounds (FACES=offline,engine
# for an 8B shape: four 8B engines do not fit one H100 at once); then HF static, HF continuous batching and
# vLLM in one process.
# Needs .gpu-pack/c1 unpacked first (bash .gpu-pack/c1/part1.sh), then:
#   bash scripts/gpu_contenders.sh OUTDIR [model folder, default .gpu-pack/model (SmolLM2-135M shape)]
# Model folders hold config and tokenizer only: weights are random (--load-format dummy).
set -uo pipefail
out=${1:?usage: gpu_contenders.sh OUTDIR [MODEL]}
model=${2:-.gpu-pack/model}
mkdir -p "$out"
# shellcheck disable=SC1091
source .gpu-pack/c2/part2.sh || exit 3
export PYTHONPATH=$PWD:$PYTHONPATH
common=(--model "$model" --load-format dummy --device cuda)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/nvidia-smi.csv"
if [ "${OFFLINE:-1}" = 1 ]; then  # OFFLINE=0 skips this part, CONTENDERS=0 the next (one GPU call each)
  timeout 540 python3 -m bench.lab_vs_offline_vllm "${common[@]}" --requests 64 --output-len "${OUTPUT_LEN:-512}" \
    --rounds "${ROUNDS:-8}" --faces "${FACES:-offline,engine,served,bare}" \
    > "$out/lab_vs_offline.txt" 2> "$out/lab_vs_offline.log"
  echo "lab_vs_offline rc=$?"; tail -9 "$out/lab_vs_offline.txt"; tail -5 "$out/lab_vs_offline.log"
fi
[ "${CONTENDERS:-1}" = 1 ] || exit 0
timeout 400 python3 -m lab bench "${common[@]}" --engines hf,hf-cb,vllm --users 1,64 --requests-per-user 1 \
  --output-len 128 --kv-cache-gib 8 --out "$out/contenders" > "$out/contenders.log" 2>&1
echo "contenders rc=$?"; grep -E "^(engine|hf |hf-cb|vllm |vLLM/|status)" "$out/contenders.log"
