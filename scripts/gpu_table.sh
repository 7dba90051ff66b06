#!/usr/bin/env bash
# Issue #9 part 4 on one lent NVIDIA GPU without network (see ../shared/gpu/README.md): HF static (fair
# attention), HF-CB, vLLM served and vLLM engine mode, SmolLM2-135M shape and Llama-3.1-8B shape (config +
# the embedded tokenizer, dummy weights), 1/5/10/20/64 users, `mixed` and `decode`, output tok/s, TTFT/TPOT
# p50, peak KV, and memory per process (nvidia-smi once a second) and per engine (torch, in the lab process).
#   bash .gpu-pack/c1/part1.sh                        # first call: vLLM's core into /tmp/site
#   bash scripts/gpu_table.sh OUTDIR PART [PART...]   # PART: 135m | 8b-hf | 8b-vllm
# 135m loads all four engines in one process. An 8B shape is ~15 GiB of weights per engine copy, so 8b-hf
# (hf, hf-cb) and 8b-vllm (vllm, vllm-engine) are two processes, one after the other. 8b-hf needs no vLLM:
# it runs without .gpu-pack/c2 (the first call can carry c1 and do it). Results gather in $GPU_TABLE_ROOT
# (default /tmp/gpu_table, kept while the machine stays warm): a plan already done is skipped, so calling
# again finishes what a call's time limit cut; each call tars the whole root into OUTDIR/gpu_table.tgz.
# Env: DEADLINE_S (seconds for all parts of this call, default 540), PLANS, KV_GIB (default 8).
set -uo pipefail
out=${1:?usage: gpu_table.sh OUTDIR 135m|8b-hf|8b-vllm ...}
shift
root=${GPU_TABLE_ROOT:-/tmp/gpu_table}
mkdir -p "$out" "$root"
if [ -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] && [ -f .gpu-pack/c2/part2.sh ]; then
  # shellcheck disable=SC1091
  source .gpu-pack/c2/part2.sh || exit 3
else
  echo "vLLM's part 2 is not here: HF engines only"
  export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_LOGGING_STREAM=ext://sys.stderr
# mixed: the workload's own lengths (prompts 16-512, outputs 16-256); decode: prompts 16-64, outputs 256-512.
# 2 requests per user up to 20 users (a user's 2nd request waits for HF's batch: TTFT shows it), 1 at 64.
read -r -a plans <<< "${PLANS:-mixed:1,5,10,20:2 mixed:64:1 decode:1,5,10,20,64:1}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$root/gpu.txt"
budget=${DEADLINE_S:-540}
for part in "$@"; do
  case $part in
    135m) model=.gpu-pack/model engines=hf,hf-cb,vllm,vllm-engine ;;
    8b-hf) model=.gpu-pack/model8b engines=hf,hf-cb ;;
    8b-vllm) model=.gpu-pack/model8b engines=vllm,vllm-engine ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  left=$((budget - SECONDS))
  if [ "$left" -lt 60 ]; then echo "$part: skipped, ${left} s left"; continue; fi
  (while :; do
     nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits | sed "s/^/$(date +%s.%N),/"
     sleep 1
   done) >> "$root/nvml-$part.csv" 2>/dev/null &
  sampler=$!
  timeout $((left + 45)) python3 -m bench.gpu_table_report run --tag "$part" --model "$model" --engines "$engines" \
    --kv-cache-gib "${KV_GIB:-8}" --hf-max-batch-size 64 --plans "${plans[@]}" --root "$root" --deadline-s "$left" \
    >> "$root/$part.out" 2>> "$root/$part.err"
  rc=$?
  kill "$sampler"; wait "$sampler" 2>/dev/null
  echo "== $part rc=$rc ($SECONDS s into this call)"
  grep -E "^(error|warning|== |$part:)|vLLM/" "$root/$part.out" | tail -30
  [ "$rc" = 0 ] || tail -15 "$root/$part.err"
done
python3 -m bench.gpu_table_report table "$root" > "$root/tables.md" 2> "$root/table.err" || tail -5 "$root/table.err"
tail -c 2500 "$root/tables.md"
tar czf "$out/gpu_table.tgz" -C "$root" . && ls -la "$out"
