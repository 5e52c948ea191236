#!/usr/bin/env bash
# Speed before and after the core / lab split (issue #60's "nothing a user does gets slower"), on one machine in
# one run: BEFORE = a worktree of ec8373f (`git worktree add /tmp/before ec8373f`), AFTER = this checkout, the
# two alternating so a busy spell of the machine hits both. Writes JSON next to this script, or into $OUT.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
after=$(cd "$here/../../.." && pwd)
before=${BEFORE:-/tmp/before}
out=${OUT:-$here}
mkdir -p "$out"
prompt="Write a Python function that returns the n-th Fibonacci number."
for round in 1 2 3; do
  for side in before after; do
    if [ $side = before ]; then tree=$before; else tree=$after; fi
    if [ $round -le 2 ]; then  # the tiny target served at C = 1..16 (every policy a user gets by default)
      (cd "$tree" && PYTHONPATH="$tree" python -m dspark.bench serve --policy none,fixed,dspark \
          --concurrency 1,2,4,8,16 --requests 32 --json "$out/serve_tiny_${side}_$round.json" > /dev/null 2>&1)
    fi
    for dtype in bfloat16 float32; do  # SmolLM2 at batch 1: one prompt, the shipped DSpark drafter
      (cd "$tree" && PYTHONPATH="$tree" python -m dspark.generate --model smollm2-135m --dtype $dtype --json \
          --max-new-tokens 128 "$prompt" > "$out/generate_smollm2_${dtype}_${side}_$round.json" 2> /dev/null)
    done
  done
done
