# Sourced by scripts/gpu_*.sh on a lent GPU without network: unpack what this call carried (the CUDA vLLM pack's
# two parts, the embedded GGUF's parts, the 8B shape's config folder) into /tmp, where it stays while the machine
# is warm, then set the environment vLLM runs in. Needs $out and $part; a "stash" call ends here.
mkdir -p "$out" /tmp/gg-parts
[ -f .gpu-pack/c1/part1.sh ] && [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] && bash .gpu-pack/c1/part1.sh
for p in .gpu-pack/gguf-*/part-*; do [ -f "$p" ] && cp "$p" /tmp/gg-parts/; done
for m in model8b model135m; do [ -d .gpu-pack/$m ] && mkdir -p /tmp/$m && cp -r .gpu-pack/$m/. /tmp/$m/; done
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
