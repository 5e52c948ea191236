#!/usr/bin/env bash
# Issue #71 steps 1-2: is anything a user runs slower? BEFORE = a git worktree of 204d77a, AFTER = 8a1525a;
# run from each in turn (python -m puts the current directory first, so each imports its own dspark).
BEFORE=${BEFORE:-/tmp/before} AFTER=${AFTER:-.}
gen() { (cd "$1" && python -m dspark.generate --model smollm2-135m --json); }   # the demo: 3 prompts, batch 1, fp32 here
serve() { (cd "$1" && python -m dspark.bench serve --temperature 0 --requests 32 "${@:2}" --json - 2>/dev/null); }
for i in 1 2 3; do gen "$BEFORE" > generate_smollm2_float32_before_$i.json; gen "$AFTER" > generate_smollm2_float32_after_$i.json; done
for i in 1 2; do
  serve "$BEFORE" --concurrency 1,4,16 --policies fixed,dspark > serve_tiny_before_$i.json
  serve "$AFTER" --concurrency 1,4,16 --policies fixed,dspark > serve_tiny_after_$i.json
done
for i in 4 5 6; do gen "$AFTER" > generate_smollm2_float32_after_$i.json; gen "$BEFORE" > generate_smollm2_float32_before_$i.json; done
for i in 1 2 3 4; do  # dspark at C = 16 again: the one point whose two runs above disagreed by 18%
  serve "$BEFORE" --concurrency 16 --policies dspark > serve_tiny_dspark_c16_before_$i.json
  serve "$AFTER" --concurrency 16 --policies dspark > serve_tiny_dspark_c16_after_$i.json
done
