#!/usr/bin/env bash
# Issue #9 part 5 on one lent NVIDIA GPU without network: what the open dashboard costs the engines
# (python -m bench.dashboard_overhead: app with no page, page open in headless Chromium, CLI; --rounds N turns).
# The GPU image lacks Gradio, Plotly, Playwright and a browser: they travel from .gpu-dash/ (git-excluded),
# made on a machine with PyPI and npm by `bash scripts/gpu_dashboard.sh pack` (~140 MB, so in 5 calls, each under
# the 64 MiB a call carries, the working tree's ~6 MB included; files written to /tmp stay while the machine is warm,
# ~30 s after each call):
#   call 1, carry .gpu-pack/c1 .gpu-dash/p1:   bash .gpu-pack/c1/part1.sh && bash scripts/gpu_dashboard.sh stage
#   calls 2-4, carry .gpu-dash/p2, then p3, then p4:   bash scripts/gpu_dashboard.sh stage
#   call 5, carry .gpu-pack/c2 .gpu-pack/model135m (MODEL=DIR: another config folder):
#           bash scripts/gpu_dashboard.sh run $OUT [bench.dashboard_overhead options]
#   (or `bash scripts/gpu_dashboard.sh install` there: unpacked without measuring, for bench.viewers and notebooks)
# run: unpacks the Python packages into /tmp/dash (a .pth puts it AFTER the image's own site-packages, so the
# image's numpy, torch, pydantic... win), Chromium (@sparticuz/chromium: a headless shell with its own NSS
# libraries) into /tmp/chrome, vLLM from .gpu-pack/c2, then measures. Default plan: 135M shape, dummy
# weights, vLLM only, 20 and 64 users, `mixed` with 128 output tokens, 8 requests per user, 3 repeats.
set -uo pipefail
cmd=${1:?usage: gpu_dashboard.sh pack|stage|run OUTDIR [options]}
shift
stage=/tmp/gpu-dash

pack() {  # here, with network: the wheels of this venv's versions for Python 3.12, and the browser
  local whl=/tmp/gpu-dash-whl site=/tmp/gpu-dash-site bin
  rm -rf "$whl" "$site" .gpu-dash && mkdir -p "$whl" .gpu-dash/npm .gpu-dash/p1 .gpu-dash/p2 .gpu-dash/p3 .gpu-dash/p4
  .venv/bin/pip freeze | grep -vE "^(-e|kvlab)|@ " > "$whl/constraints.txt"
  local plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform any)
  for p in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux1 manylinux_2_5; do
    plat+=(--platform "${p}_x86_64")
  done
  python3 -m pip download "${plat[@]}" -c "$whl/constraints.txt" -d "$whl" \
    "$(.venv/bin/pip freeze | grep -i '^gradio==')" "$(.venv/bin/pip freeze | grep -i '^gradio.client==')" \
    "$(.venv/bin/pip freeze | grep -i '^plotly==')" "$(.venv/bin/pip freeze | grep -i '^playwright==')" || return 1
  # the image has these (torch's numpy and pillow, transformers' hub, vLLM's pydantic from .gpu-pack/c2)
  python3 -m pip install -q --no-deps --no-compile --target "$site" "${plat[@]}" \
    $(ls "$whl"/*.whl | grep -vE "/(numpy|pillow|huggingface_hub|hf_xet|pydantic|pydantic_core)-") || return 1
  find "$site" -name "*.map" -delete  # source maps: half of the frontends' bytes
  rm -rf "$site"/plotly/labextension "$site"/share "$site"/bin "$site"/include "$site"/gradio/templates/node
  tar -C "$site" -cf - . | xz -T2 -6 > .gpu-dash/site.tar.xz
  (cd .gpu-dash/npm && npm pack @sparticuz/chromium@153.0.0 && tar xzf sparticuz-chromium-153.0.0.tgz)
  bin=.gpu-dash/npm/package/bin
  cp "$bin"/al2023.tar.br "$bin"/fonts.tar.br .gpu-dash/p1/
  head -c 45000000 .gpu-dash/site.tar.xz > .gpu-dash/p2/site.tar.xz.aa  # each part + the working tree < 64 MiB
  head -c 58500000 "$bin"/chromium.br > .gpu-dash/p3/chromium.br.aa
  tail -c +45000001 .gpu-dash/site.tar.xz > .gpu-dash/p4/site.tar.xz.ab
  tail -c +58500001 "$bin"/chromium.br > .gpu-dash/p4/chromium.br.ab
  du -b .gpu-dash/p*
}

stage() {  # on the GPU machine: keep what this call carried where the next calls find it
  mkdir -p "$stage" && cp -f .gpu-dash/p*/* "$stage"/ 2>/dev/null
  ls -la "$stage"
}

install() {  # on the GPU machine, once every part is staged
  for part in al2023.tar.br fonts.tar.br site.tar.xz.aa site.tar.xz.ab chromium.br.aa chromium.br.ab; do
    [ -f "$stage/$part" ] || { echo "missing $stage/$part: stage every part first (calls 1-4)"; return 3; }
  done
  mkdir -p /tmp/dash /tmp/chrome /tmp/fonts
  [ -d /tmp/dash/gradio ] || cat "$stage"/site.tar.xz.* | xz -dc | tar -C /tmp/dash -xf - || return 3
  local sp
  sp=$(python3 -c "import site; print(site.getsitepackages()[0])")
  echo /tmp/dash > "$sp/zz-kvlab-dash.pth"  # appended to sys.path after the image's own packages
  PYTHONPATH=/tmp/dash python3 - "$stage" <<'EOF' || return 3
import brotli, io, os, sys, tarfile
stage = sys.argv[1]
if not os.path.exists("/tmp/chrome/chromium"):
    parts = b"".join(open(f"{stage}/chromium.br.{p}", "rb").read() for p in ("aa", "ab"))
    open("/tmp/chrome/chromium", "wb").write(brotli.decompress(parts))
    os.chmod("/tmp/chrome/chromium", 0o755)
for name, into in (("al2023", "/tmp/chrome/al2023"), ("fonts", "/tmp/fonts")):
    tarfile.open(fileobj=io.BytesIO(brotli.decompress(open(f"{stage}/{name}.tar.br", "rb").read()))).extractall(into)
EOF
  cat > /tmp/chrome/chrome.sh <<'EOF'
#!/bin/sh
export LD_LIBRARY_PATH=/tmp/chrome/al2023/lib FONTCONFIG_PATH=/tmp/fonts
exec /tmp/chrome/chromium "$@"
EOF
  chmod +x /tmp/chrome/chrome.sh
  /tmp/chrome/chrome.sh --version
}

run() {  # SRC=DIR: measure the lab in DIR (e.g. an older lab/ and app.py) with this checkout's packages and model
  local out=${1:?usage: gpu_dashboard.sh run OUTDIR [options]} root=$PWD
  shift
  stage
  install || return 3
  part=dash  # vLLM from .gpu-pack/c2 when carried, else from /tmp/site where an earlier call unpacked it
  # shellcheck disable=SC1091
  source scripts/gpu_stash.sh
  cd "${SRC:-.}" || return 3
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_LOGGING_STREAM=ext://sys.stderr GRADIO_ANALYTICS_ENABLED=False
  python3 -c "import gradio, plotly, playwright; print('gradio', gradio.__version__, 'plotly', plotly.__version__)" || return 3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
  python3 -m bench.dashboard_overhead --chromium /tmp/chrome/chrome.sh --chromium-arg=--no-zygote --out "$out" \
    --device cuda --model "${MODEL:-$root/.gpu-pack/model135m}" --load-format dummy --kv-cache-gib 8 --engines vllm \
    --users 20,64 --output-len 128 --requests-per-user 8 --repeats 3 "$@" 2>&1 | tee "$out/bench.out"
}

case $cmd in
  pack) pack ;;
  stage) stage ;;
  install) stage && install ;;
  run) run "$@" ;;
  *) echo "unknown command $cmd"; exit 2 ;;
esac
