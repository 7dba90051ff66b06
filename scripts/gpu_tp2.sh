#!/usr/bin/env bash
# Serve mode across two GPUs (issue #10.5): a Llama-3.1-8B-shaped vLLM server with tensor parallelism 2
# beside one on a single GPU, both load-tested by the lab's `openai` engine in one run (ratio tp2/tp1).
# Runs on a lent 2-GPU machine without network (see ../shared/gpu/README.md), after
# `bash .gpu-pack/c1/part1.sh`:   bash scripts/gpu_tp2.sh OUTDIR [MODEL folder, default .gpu-pack/model8b]
# Weights are random (--load-format dummy): speed and memory are faithful, the text is noise.
set -uo pipefail
out=${1:?usage: gpu_tp2.sh OUTDIR [MODEL]}
model=${2:-.gpu-pack/model8b}
mkdir -p "$out"
# shellcheck disable=SC1091
source .gpu-pack/c2/part2.sh || exit 3
if [ -d .whl ]; then  # vLLM's OpenAI server needs uvicorn and prometheus-fastapi-instrumentator beside the pack
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=$PWD:$PYTHONPATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_SERVER_DEV_MODE=1 VLLM_NO_USAGE_STATS=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/nvidia-smi.csv"
serve() {  # serve NAME PORT GPUS TP: start one server in the background, its log in OUTDIR
  CUDA_VISIBLE_DEVICES=$3 python3 -m vllm.entrypoints.openai.api_server --model "$model" --load-format dummy \
    --served-model-name llama8b-dummy --host 127.0.0.1 --port "$2" --tensor-parallel-size "$4" \
    --gpu-memory-utilization 0.42 --max-model-len 4096 > "$out/server-$1.log" 2>&1 &
}
ready() {  # ready PORT PID: wait up to 300 s for /health, giving up at once if the server exited
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null && return 0
    kill -0 "$2" 2> /dev/null || return 1
    sleep 0.5
  done
  return 1
}
serve tp1 8001 0 1
ready 8001 $! || { echo "tp1 did not start"; tail -30 "$out/server-tp1.log"; exit 4; }
serve tp2 8002 0,1 2
ready 8002 $! || { echo "tp2 did not start"; tail -30 "$out/server-tp2.log"; exit 4; }
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$out/memory.csv"
timeout 300 python3 -m lab bench --model "$model" --load-format dummy --device cuda \
  --endpoint tp1=http://127.0.0.1:8001 --endpoint tp2=http://127.0.0.1:8002 --served-model-name llama8b-dummy \
  --engines tp1,tp2 --users "${USERS:-1,16,64}" --requests-per-user 2 --workload mixed --output-len 256 \
  --out "$out/tp" > "$out/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^(engine|tp1|tp2|-|tp2/tp1|status)" "$out/bench.log"
kill %1 %2 2> /dev/null; wait
