#!/usr/bin/env bash
# The GPU half of issue #8's measurements on a lent NVIDIA machine without network (../shared/gpu/README.md):
# the Workshop demo's candidates (bench.workshop_demo) and the seeds' sweeps (max_num_seqs, HF batch size).
# Needs .gpu-pack/c1 unpacked first (bash .gpu-pack/c1/part1.sh), then: bash scripts/gpu_workshop.sh OUTDIR demo
# and (a second call, each fits the lent machine's 10-minute limit): bash scripts/gpu_workshop.sh OUTDIR sweeps
# The model folder .gpu-pack/model holds SmolLM2's config and tokenizer only (--load-format dummy).
set -uo pipefail
out=${1:?usage: gpu_workshop.sh OUTDIR demo|sweeps}
part=${2:?usage: gpu_workshop.sh OUTDIR demo|sweeps}
mkdir -p "$out"
# shellcheck disable=SC1091
source .gpu-pack/c2/part2.sh || exit 3
export PYTHONPATH=$PWD:$PYTHONPATH VLLM_LOGGING_STREAM=ext://sys.stderr
model=.gpu-pack/model
common=(--model "$model" --load-format dummy --device cuda)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [ "$part" = demo ]; then
timeout 400 python3 -m bench.workshop_demo --device cuda --model "$model" --load-format dummy \
  > "$out/workshop_demo.txt" 2> "$out/workshop_demo.err"; echo "demo rc=$?"; cat "$out/workshop_demo.txt"
exit 0
fi
sweep=(--users 32 --requests-per-user 2 --workload mixed --output-len 64)
timeout 200 python3 -m lab sweep hf_max_batch_size --values 4,8,16,32 "${common[@]}" "${sweep[@]}" \
  --out "$out/sweep-hf" > "$out/sweep-hf.log" 2>&1; echo "hf sweep rc=$?"
timeout 320 python3 -m lab sweep max_num_seqs --values 1,16,256 "${common[@]}" "${sweep[@]}" \
  --out "$out/sweep-seqs" > "$out/sweep-seqs.log" 2>&1; echo "seqs sweep rc=$?"
for f in "$out"/sweep-*/sweep.csv; do echo "== $f"; cut -d, -f1-9 "$f"; done
