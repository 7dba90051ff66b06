#!/usr/bin/env bash
# Issues #40 and #41 on one lent NVIDIA GPU without network (../shared/gpu/README.md): each level's ratio taken
# apart into its steps with each engine's floor, the ladder at every load with its new rungs, and vLLM's step caps
# as the lab used to set them against `vllm serve`'s. Model folders carried: .gpu-pack/model135m (SmolLM2-135M's
# config and tokenizer) and .gpu-pack/model8b (Llama-3.1-8B's config, the same tokenizer): random weights
# (--load-format dummy), exact output lengths: speed and memory are faithful, text is not.
# (tar cJf .gpu-pack/models.tar.xz -C .gpu-pack model135m model8b: the two folders, small enough to carry beside c1)
#   call 1 (carry .gpu-pack/c1 .gpu-pack/models.tar.xz):  bash scripts/gpu_factors.sh OUT stash
#   call 2.. (carry .gpu-pack/c2):                        bash scripts/gpu_factors.sh OUT PART...
# PART: probe (the copy bandwidth against the part's published peak), defaults (old caps against vllm serve's,
# 64 users of mixed and sharegpt, paired repeats), demo (hf and vllm at the Workshop demo's levels), 8b (64 users
# of mixed on the 8B shape), ladder (spread at 1, 8 and 64 users with every rung). Env: REPEATS (3), KV_GIB (8).
set -uo pipefail
out=${1:?usage: gpu_factors.sh OUT stash|PART...}; shift
part=${1:-stash}
# the two model folders travel as one archive (.gpu-pack/models.tar.xz), unpacked into /tmp where they stay
[ -f .gpu-pack/models.tar.xz ] && [ ! -f /tmp/model8b/config.json ] && tar xJf .gpu-pack/models.tar.xz -C /tmp
# shellcheck disable=SC1091
source scripts/gpu_stash.sh
dummy=(--device cuda --load-format dummy --kv-cache-gib "${KV_GIB:-8}")
r=${REPEATS:-3}
for part in "$@"; do
  began=$SECONDS
  case $part in
    probe) python3 -c "from lab.engines.bandwidth import measure; import json; print(json.dumps(measure('cuda')))" \
             > "$out/probe.json" 2> "$out/probe.log" ;;
    defaults) python3 -m bench.serve_defaults "${dummy[@]}" --model /tmp/model135m --gpu-memory-utilization 0.2 \
                --workloads mixed,sharegpt --users 64 --repeats "$r" --out "$out/defaults" \
                > "$out/defaults.txt" 2> "$out/defaults.log" ;;
    demo) python3 -m lab bench "${dummy[@]}" --model /tmp/model135m --engines hf,vllm --users 10,32,64 \
            --workload mixed --requests-per-user 2 --repeats 2 --hf-max-batch-size 64 --out "$out/demo" \
            > "$out/demo.txt" 2> "$out/demo.log" ;;
    8b) python3 -m lab bench "${dummy[@]}" --model /tmp/model8b --engines hf,vllm --users 64 --workload mixed \
          --requests-per-user 1 --repeats 2 --hf-max-batch-size 64 --out "$out/8b" > "$out/8b.txt" 2> "$out/8b.log" ;;
    ladder) python3 -m lab explain "${dummy[@]}" --model /tmp/model135m --preset spread --users "${LADDER_USERS:-1,8,64}" \
              --repeats "${LADDER_REPEATS:-2}" --rungs "${RUNGS:-hf,hf-cb,vllm-hf-code,vllm-eager,vllm-compiled,vllm}" \
              --out "$out/ladder" > "$out/ladder.txt" 2> "$out/ladder.log" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "$part rc=$? in $((SECONDS - began)) s"
  grep -E "Error|error:" "$out/$part.log" 2>/dev/null | tail -3
done
