#!/usr/bin/env bash
# Issue #71 step 3 (plain decoding = the engine at γ = 0, one object per request, host-read counting and input
# validation in the lab, the lab's hooks out of model.py / training.py / drafters): is anything a user runs slower?
# BEFORE = a git worktree of 4b19396, AFTER = this checkout; run from each in turn, alternating (python -m puts the
# current directory first, so each imports its own dspark). Run from this folder.
BEFORE=${BEFORE:-/tmp/before} AFTER=${AFTER:-$(git rev-parse --show-toplevel)}
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
# C = 1 again (fixed and dspark were 0.88x / 0.92x in the two runs above): four more alternating runs each
serve1() { (cd "$1" && python -m dspark.bench serve --temperature 0 --requests 32 --concurrency 1 --policies fixed,dspark --json - 2>/dev/null); }
for i in 1 2 3 4; do serve1 "$BEFORE" > serve_tiny_c1_before_$i.json; serve1 "$AFTER" > serve_tiny_c1_after_$i.json; done
