# Sourced by scripts/gpu_*.sh on a lent GPU without network: unpack what this call carried (the CUDA vLLM pack's
# two parts, the embedded GGUF's parts, the 8B shape's config folder) into /tmp, where it stays while the machine
# is warm, then set the environment vLLM runs in. Needs $out and $part; a "stash" call ends here.
# The image has no plotly, which the notebooks import: .gpu-pack/plotly/p.tar.xz (5 MB; from .venv's site-packages:
# tar cJf .gpu-pack/plotly/p.tar.xz plotly _plotly_utils plotly-*.dist-info narwhals narwhals-*.dist-info), carried
# beside c2, joins the path from /tmp/pl. transformers' GGUF reader (lab setup-model) needs the `gguf` package:
# .gpu-pack/gguf-py (cp -r .venv/.../site-packages/gguf .venv/.../gguf-*.dist-info), copied to /tmp/gg.
mkdir -p "$out" /tmp/gg-parts /tmp/pl /tmp/gg
[ -d .gpu-pack/gguf-py ] && cp -r .gpu-pack/gguf-py/. /tmp/gg/
[ -f .gpu-pack/plotly/p.tar.xz ] && [ ! -d /tmp/pl/plotly ] && tar xJf .gpu-pack/plotly/p.tar.xz -C /tmp/pl
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
[ -d /tmp/pl/plotly ] && export PYTHONPATH=$PYTHONPATH:/tmp/pl
