#!/usr/bin/env bash
# Proves the GPU path on a lent NVIDIA machine without network (see ../shared/gpu/README.md):
# NVML readings, the memory planner, both engines on one card, HF with the fair and the naive attention.
# Needs .gpu-pack/c1 unpacked first (bash .gpu-pack/c1/part1.sh), then: bash scripts/gpu_check.sh OUTDIR
# The model folder .gpu-pack/model holds SmolLM2's config and tokenizer only: weights are random
# (--load-format dummy), which measures speed and memory faithfully.
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
# shellcheck disable=SC1091
source .gpu-pack/c2/part2.sh || exit 3
export PYTHONPATH=$PWD:$PYTHONPATH
model=.gpu-pack/model
common=(--model "$model" --load-format dummy --device cuda)
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/nvidia-smi.csv"
python3 -m lab env "${common[@]}" > "$out/env.json"; echo "env rc=$?"; head -c 1500 "$out/env.json"
python3 -m lab bench "${common[@]}" --gpu-memory-utilization 0.999 --users 1 --out "$out/bad" 2>&1 | tail -2
echo "planner rc=${PIPESTATUS[0]} (2 = rejected before loading)"
bench=(--users 1,5,10,20 --requests-per-user 4 --workload mixed --max-model-len 2048)
timeout 280 python3 -m lab bench "${common[@]}" "${bench[@]}" --enforce-eager --out "$out/fair" > "$out/fair.log" 2>&1
echo "fair rc=$?"; grep -E "^(engine|hf |vllm |vLLM/HF|status)" "$out/fair.log"
timeout 200 python3 -m lab bench "${common[@]}" "${bench[@]}" --enforce-eager --hf-cudnn-sdp --engines hf \
  --out "$out/naive" > "$out/naive.log" 2>&1
echo "naive rc=$?"; grep -E "^(engine|hf |status)" "$out/naive.log"
