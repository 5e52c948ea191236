"""Sample self-written instructions from a chat target (Magpie) into a prompts file.

The target is given its chat template up to the user's turn (and, for code and math, the opening of the
turn: `dspark.lab.data.instructions.PREFIXES`) and writes the rest of the user's message at temperature 1 with
top-p 0.95; `drop_reason` and `NearDuplicates` filter the samples, `split_of` sorts each kept one into
train / val / eval. The file is JSON lines `{"prompt", "domain", "split", "opening"}`, appended to batch by
batch; a state file beside it (`OUT.state.json`) records how many batches of each domain are done and why
samples were dropped, so an interrupted run continues with the batch it stopped at (the seed of a batch
is its domain and number: the resumed run writes what the uninterrupted one would have).

`python -m dspark.train instructions` runs it; `python -m dspark.train responses --prompts OUT` answers the
train and val prompts.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.decoding import generate
from dspark.lab.data.instructions import INSTRUCTION_DOMAINS, PREFIXES, NearDuplicates, drop_reason, split_of
from dspark.lab.storage import write_text_atomic
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.tokenizer import Tokenizer

SAMPLING = SamplingParams(temperature=1.0, top_p=0.95)


def state_path(out_path: Path) -> Path:
    return Path(out_path).with_name(Path(out_path).name + ".state.json")


def read_kept(out_path: Path) -> list[dict]:
    """The records already in `out_path` (none when it does not exist)."""
    if not Path(out_path).is_file():
        return []
    with open(out_path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@torch.no_grad()
def sample_instructions(
    target: Transformer,
    tokenizer: Tokenizer,
    out_path: Path,
    per_domain: dict[str, int],
    batch_size: int = 128,
    max_tokens: int = 112,
    seed: int = 0,
) -> Counter:
    """Append kept instructions to `out_path` until each domain has `per_domain[domain]` (all splits together);
    returns the drop reasons counted over the whole run (resumed runs included)."""
    out_path = Path(out_path)
    kept = read_kept(out_path)
    state = json.loads(state_path(out_path).read_text()) if state_path(out_path).is_file() else {}
    batches = Counter(state.get("batches", {}))
    dropped = Counter(state.get("dropped", {}))
    have = Counter(r["domain"] for r in kept)
    dupes = NearDuplicates()
    for r in kept:
        dupes.add(r["prompt"])
    bar = tqdm(total=sum(per_domain.values()), initial=sum(min(have[d], n) for d, n in per_domain.items()),
               desc="instructions", unit="prompt")  # fmt: skip
    longest = max(len(tokenizer.user_turn(o)) for openings in PREFIXES.values() for o in openings)
    context = longest + max_tokens  # a KV cache as long as the longest row needs
    with open(out_path, "a", encoding="utf-8") as f:
        while True:
            short = [d for d in INSTRUCTION_DOMAINS if have[d] < per_domain.get(d, 0)]
            if not short:
                break
            domain = min(short, key=lambda d: have[d] / per_domain[d])  # the one furthest from its count
            number = batches[domain]
            rng = random.Random(f"{seed}/{domain}/{number}")
            openings = [rng.choice(PREFIXES[domain]) for _ in range(batch_size)]
            gen = torch.Generator().manual_seed(rng.randrange(2**62))
            result = generate(target, [tokenizer.user_turn(o) for o in openings], max_tokens, SAMPLING, gen,
                              tokenizer.eos_id, context)  # fmt: skip
            for opening, ids, stop in zip(openings, result.tokens, result.stop_reasons):
                text = tokenizer.decode([*tokenizer.encode(opening), *ids]).strip()
                reason = drop_reason(text, domain, ended=stop == "eos")
                if reason is None and dupes.seen(text):
                    reason = "near-duplicate"
                if reason is not None:
                    dropped[reason] += 1
                    continue
                dupes.add(text)
                record = {"prompt": text, "domain": domain, "split": split_of(text), "opening": opening}
                f.write(json.dumps(record) + "\n")
                have[domain] += 1
                bar.update(int(have[domain] <= per_domain[domain]))
            f.flush()
            batches[domain] += 1
            write_text_atomic(
                state_path(out_path), json.dumps({"batches": batches, "dropped": dropped}) + "\n"
            )
    bar.close()
    return dropped
