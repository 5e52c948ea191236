#!/usr/bin/env bash
# Issue #71 step 4 (no validators deeper than the core's entry points; contracts as one-line asserts; one host read less per
# step): is anything a user runs slower?
# BEFORE = a git worktree of 1ae7147, AFTER = one of 51a63f8 (main after it also learns its costs, #69); run from each in turn, alternating (python -m puts the
# current directory first, so each imports its own dspark). Run from this folder.
BEFORE=${BEFORE:-/tmp/before} AFTER=${AFTER:-/tmp/after}
gen() { (cd "$1" && python -m dspark.generate --model smollm2-135m --json); }   # the demo: 3 prompts, batch 1, with plain decoding beside it
serve() { (cd "$1" && python -m dspark.bench serve --temperature 0 --requests 32 --concurrency 1,4,16 --policies none,fixed,dspark --json - 2>/dev/null); }
plain() { (cd "$1" && python - <<'PY'
import json, time, torch
from dspark.checkpoint import TARGET_CHECKPOINT, load_target
from dspark.decoding import generate
from dspark.sampling import SamplingParams
target, _ = load_target(TARGET_CHECKPOINT); target.eval()
torch.set_num_threads(2)
rows = []
for batch in (1, 4, 16):
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, 90, (24,), generator=g).tolist() for _ in range(batch)]
    generate(target, prompts, 8, SamplingParams(0.0))  # warm-up
    best = []
    for _ in range(5):
        r = generate(target, prompts, 32, SamplingParams(0.0))
        best.append(r.tokens_per_s)
    rows.append({"batch": batch, "tokens_per_s_median": sorted(best)[2], "tokens": r.tokens})
print(json.dumps(rows))
PY
); }
for i in 1 2 3; do
  gen "$BEFORE" > generate_smollm2_float32_before_$i.json; gen "$AFTER" > generate_smollm2_float32_after_$i.json
  plain "$BEFORE" > plain_tiny_before_$i.json; plain "$AFTER" > plain_tiny_after_$i.json
done
for i in 1 2; do serve "$BEFORE" > serve_tiny_before_$i.json; serve "$AFTER" > serve_tiny_after_$i.json; done
# the SmolLM2 demo again, 3 more alternating pairs (the third pair above differed by 19% on dspark, 3% on plain)
for i in 4 5 6; do
  gen "$BEFORE" > generate_smollm2_float32_before_$i.json; gen "$AFTER" > generate_smollm2_float32_after_$i.json
done
