#!/usr/bin/env bash
# The GPU track (docs/workshop.md): the guided notebooks on one lent NVIDIA GPU without network
# (../shared/gpu/README.md), each as a learner runs it (bench.notebook_times: a fresh process per notebook), from a
# clean copy of a commit (.gpu-pack/head/head.tar, made by `git archive HEAD`), so edits in the working tree do not
# matter. The SmolLM2-135M shape with random weights (.gpu-pack/models.tar.xz: its config folder). The notebooks of
# one call run in STREAMS side by side on the one GPU (one stream: one after another), each stream with its own lab
# cache; a session's device time does not hold the seven one after another. The machine keeps /tmp while warm (~30 s):
#   call 1 (carry .gpu-pack/c1 .gpu-pack/models.tar.xz):              bash scripts/gpu_notebooks.sh OUT stash
#   call 2 (carry .gpu-pack/c2 .gpu-pack/plotly .gpu-pack/head):      bash scripts/gpu_notebooks.sh OUT 03 02
#   call 3 (nothing carried):                                         bash scripts/gpu_notebooks.sh OUT 04 05,06
#   call 4 (nothing carried):                                         bash scripts/gpu_notebooks.sh OUT 07 01
# (04 needs ~510 s beside short notebooks: beside 02 and 03 it ran past a call's limit; docs/results/h200-notebooks/.)
# STREAM: a comma list of notebook numbers. Env: DEADLINE_S (580: every notebook of the call stops by then, each
# with the time left as its --limit-s). OUT gets res.tar.gz (each notebook's output, NN_name.txt, each stream's
# table and log, nvidia-smi every 5 s), each stream's table (stream-N.txt) and gpu.txt.
set -uo pipefail
out=${1:?usage: gpu_notebooks.sh OUT stash|STREAM...}; shift; part=${1:?}
[ "$part" = stash ] || part=135m
began=$SECONDS
[ -f .gpu-pack/models.tar.xz ] && [ ! -f /tmp/model135m/config.json ] && tar xJf .gpu-pack/models.tar.xz -C /tmp
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
if [ -f .gpu-pack/head/head.tar ] && [ ! -d /tmp/h/notebooks ]; then
  mkdir -p /tmp/h && tar xf .gpu-pack/head/head.tar -C /tmp/h || exit 3
fi
[ -d /tmp/h/notebooks ] || { echo "no clean copy in /tmp/h: carry .gpu-pack/head"; exit 3; }
res=/tmp/res/$(date +%H%M%S); mkdir -p "$res/nb"
nvidia-smi > "$res/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$res/smi.csv" 2>&1 &
smi=$!
cd /tmp/h || exit 3
export PYTHONPATH="/tmp/h:${PYTHONPATH#"$OLDPWD":}"
deadline=${DEADLINE_S:-580}
stream() {  # $1: the stream's number, $2: its notebooks, one after another, each with the call's time left
  for nb in ${2//,/ }; do
    left=$(( deadline - SECONDS + began ))
    [ "$left" -lt 60 ] && { echo "$nb: not started, $left s left"; continue; }
    KVLAB_CACHE=/tmp/kvlab-$1 python3 -m bench.notebook_times --model /tmp/model135m --load-format dummy \
      --limit-s "$left" --notebooks "$nb" --outputs "$res/nb"
  done > "$res/stream-$1.txt" 2> "$res/stream-$1.log"
}
n=0; pids=()
for notebooks in "$@"; do n=$((n + 1)); stream "$n" "$notebooks" & pids+=($!); done
wait "${pids[@]}"
kill "$smi"
for f in "$res"/stream-*.txt; do echo "== $f"; cat "$f"; cp "$f" "$out/"; done
grep -hE "Error|error:|failed" "$res"/stream-*.log | tail -5
gzip -f "$res"/stream-*.log
tar czf "$out/res.tar.gz" -C /tmp/res "${res##*/}"
echo "call took $((SECONDS - began)) s"
