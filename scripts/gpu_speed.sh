#!/usr/bin/env bash
# Issue #25 parts 5 and 4 on one lent NVIDIA GPU without network (../shared/gpu/README.md): where a short level's
# time goes (the lab's vLLM faces against offline LLM.generate, bench.lab_vs_offline_vllm --trace) at 64 users x 1
# request of `mixed`, and a KV-budget sweep, on the SmolLM2-135M and Llama-3.1-8B shapes with random weights (their
# config folders carried: .gpu-pack/model135m, .gpu-pack/model8b; no GGUF parts to carry).
# The viewers job (bench.viewers) needs Gradio, which the image lacks: `bash scripts/gpu_dashboard.sh pack` makes
# its packages' two parts (.gpu-dash/p2/site.tar.xz.aa, .gpu-dash/p4/site.tar.xz.ab), carried by stash calls.
#   bash scripts/gpu_speed.sh OUT stash             # carry .gpu-pack/c1 (and the site's small part), then the big part
#   bash scripts/gpu_speed.sh OUT 135m|8b JOBS      # the first such call carries .gpu-pack/c2 and the model folders
# JOBS: comma list of trace, kvsweep, viewers, notebooks (each guided notebook's time and answers, from the working
# tree, one after another; scripts/gpu_notebooks.sh runs them from a clean commit, side by side), demo (the
# Workshop demo's GPU candidates, bench.workshop_demo).
# Env: ROUNDS (6), FACES (offline,engine,served), KV_VALUES, NOTEBOOKS (all), NOTEBOOK_LIMIT_S (480: one
# notebook, stopped before a device call's 10 minutes, says which cell it reached), DEADLINE_S (570).
set -uo pipefail
out=${1:?usage: gpu_speed.sh OUT stash|135m|8b [JOBS]}; part=${2:?}; jobs=${3:-trace}
mkdir -p /tmp/gpu-dash && cp -f .gpu-dash/p*/site.tar.xz.* /tmp/gpu-dash/ 2>/dev/null
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
model=(--device cuda --model "/tmp/model$part" --load-format dummy)
share=(); [ "$part" = 8b ] && share=(--gpu-memory-utilization 0.28)  # three 8B faces at once: each asks this share
began=$(date +%s)
for job in ${jobs//,/ }; do
  left=$(( ${DEADLINE_S:-570} - $(date +%s) + began )); [ "$left" -lt 30 ] && { echo "no time left for $job"; break; }
  tag=$part-$job
  case $job in
    trace) cmd=(python3 -m bench.lab_vs_offline_vllm "${model[@]}" "${share[@]}" --requests 64 --workload mixed
                --rounds "${ROUNDS:-6}" --faces "${FACES:-offline,engine,served}" --trace --kv-cache-gib 8) ;;
    kvsweep) values=0.1,0.3,0.7; [ "$part" = 8b ] && values=1,2,3  # each holds one 2,048-token request
             cmd=(python3 -m lab sweep kv_cache_gib --values "${KV_VALUES:-$values}" --users 64
                  --workload mixed --requests-per-user 2 "${model[@]}" --out "$out/$tag") ;;
    notebooks) cmd=(python3 -m bench.notebook_times --model "/tmp/model$part" --load-format dummy
                    --limit-s "${NOTEBOOK_LIMIT_S:-480}" ${NOTEBOOKS:+--notebooks "$NOTEBOOKS"} --outputs "$out/$tag") ;;
    demo) cmd=(python3 -m bench.workshop_demo "${model[@]}") ;;
    viewers) if [ ! -d /tmp/dash/gradio ]; then  # after the image's own packages, as gpu_dashboard.sh does
               mkdir -p /tmp/dash && cat /tmp/gpu-dash/site.tar.xz.* | xz -dc | tar -C /tmp/dash -xf - || exit 3
               echo /tmp/dash > "$(python3 -c "import site; print(site.getsitepackages()[0])")/zz-kvlab-dash.pth"
             fi
             cmd=(python3 -m bench.viewers --viewers 1,10,50 --engines hf,vllm --users 1,8 --output-len 32
                  --requests-per-user 2 --repeats 3 --viewer-cpus 4 "${model[@]}" --out "$out/$tag") ;;
  esac
  timeout "$left" "${cmd[@]}" > "$out/$tag.txt" 2> "$out/$tag.log"
  echo "== $tag rc=$?"; tail -25 "$out/$tag.txt"; grep -E "Error|error:" "$out/$tag.log" | tail -3
  gzip -f "$out/$tag.log"
done
