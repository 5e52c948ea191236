"""Target-regenerated responses: the data drafters learn from.

A drafter must imitate the *target*, not the corpus: so the training prompts
are answered again by the shipped target itself (sampled at temperature 1,
like the paper), and drafters train on prompt + regenerated response. The
result is cached on disk as JSON lines `{"domain", "split", "prompt_ids",
"response_ids"}`; an interrupted run continues where it stopped, and a
larger selection (more prompts per domain) answers only the prompts not yet answered.
A gzipped copy (`*.jsonl.gz`, as committed under walkthrough/data/) reads like the file itself.

What this file does not do: train anything, or touch the held-out evaluation
prompts (only the corpus's train and val splits are used).
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from pathlib import Path

import torch
from tqdm import tqdm

from dspark.decoding import generate
from dspark.lab.data.corpus import DOMAINS
from dspark.lab.data.prompt_files import PromptRecord
from dspark.model import Transformer
from dspark.sampling import SamplingParams
from dspark.tokenizer import Tokenizer


def pick_prompts(
    corpus_path: Path, per_domain: dict[str, int], max_prompt_tokens: int, tokenizer: Tokenizer, seed: int
):
    """A seeded selection of (domain, split, prompt ids) from the corpus's train and val splits, interleaved:
    the first prompt of every (domain, split), then the second of each, and so on, so that a run stopped
    anywhere leaves every domain with as many answers as the others (and a larger selection starts with the
    same prompts as a smaller one)."""
    by_key: dict[tuple[str, str], list[str]] = {}
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            if s["split"] in ("train", "val"):
                by_key.setdefault((s["domain"], s["split"]), []).append(s["prompt"])
    rng = random.Random(seed)
    ranked = []  # (rank within its (domain, split), domain, split, ids)
    for (domain, split), prompts in sorted(by_key.items()):
        want = per_domain[split]
        # shuffled even when none are wanted: each list's order is the same whatever the counts
        rng.shuffle(prompts)
        taken = 0
        for p in prompts:
            if taken == want:
                break
            ids = tokenizer.chat_prompt(p)
            if len(ids) <= max_prompt_tokens:
                ranked.append((taken, domain, split, ids))
                taken += 1
    return interleave(ranked)


def interleave(ranked: list[tuple[int, str, str, list[int]]]) -> list[tuple[str, str, list[int]]]:
    """(rank within its (domain, split), domain, split, ids) -> (domain, split, ids), the first of every
    (domain, split) first: a run stopped anywhere leaves every domain with as many answers as the others."""
    ranked.sort(key=lambda r: r[:3])
    return [(domain, split, ids) for _, domain, split, ids in ranked]


def pick_from_file(
    records: list[PromptRecord], per_domain: dict[str, int], max_prompt_tokens: int, tokenizer: Tokenizer
) -> list[tuple[str, str, list[int]]]:
    """(domain, split, prompt ids) of a prompts file's train and val records (a record without a split counts
    as train), in file order within each (domain, split), at most `per_domain[split]` of each, interleaved;
    prompts longer than `max_prompt_tokens` are left out."""
    taken: dict[tuple[str, str], int] = {}
    ranked = []
    for r in records:
        split = r.split or "train"
        if split not in per_domain:
            continue
        key = (r.domain, split)
        rank = taken.get(key, 0)
        if rank == per_domain[split]:
            continue
        ids = tokenizer.chat_prompt(r.prompt)
        if len(ids) <= max_prompt_tokens:
            ranked.append((rank, r.domain, split, ids))
            taken[key] = rank + 1
    return interleave(ranked)


def open_records(path: Path):
    """A responses file opened for reading text: gzip-compressed when its name ends in .gz."""
    path = Path(path)
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def refuse_gzipped_output(out_path: Path) -> None:
    """ValueError (one line) for an output path ending in .gz: answers are appended as they come, which a
    gzip stream does not allow; gzip a finished file instead."""
    if Path(out_path).suffix == ".gz":
        raise ValueError(f"{out_path}: responses are appended as plain JSON lines; write a .jsonl and gzip it "
                         "when it is complete")  # fmt: skip


def answered_prompts(out_path: Path) -> set[tuple[str, str, tuple[int, ...]]]:
    """The (domain, split, prompt ids) already answered in `out_path` (empty when it does not exist), which a
    resumed run skips. ValueError (one line, naming the line) when `out_path` holds anything but response
    records: the run would append to someone else's file."""
    if not Path(out_path).exists():
        return set()
    done, number = set(), 0
    try:
        with open_records(out_path) as f:
            for number, line in enumerate(f, start=1):  # noqa: B007 (named in the error below)
                if line.strip():
                    r = json.loads(line)
                    done.add((r["domain"], r["split"], tuple(r["prompt_ids"])))
                    r["response_ids"]  # noqa: B018
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        why = f"no {exc} field" if isinstance(exc, KeyError) else type(exc).__name__
        raise ValueError(f"{out_path} line {number} is not a response record ({why}), so it is not an earlier "
                         "run to resume: choose another --out") from None  # fmt: skip
    return done


@torch.no_grad()
def regenerate(
    target: Transformer,
    tokenizer: Tokenizer,
    source: Path | list[PromptRecord],
    out_path: Path,
    train_per_domain: int,
    val_per_domain: int,
    max_new_tokens: int,
    batch_size: int,
    seed: int = 0,
) -> int:
    """Append target responses to `out_path` until every chosen prompt has one; returns the count. `source` is
    the corpus file (its train and val prompts) or the records of a prompts file (`read_prompts`).
    `out_path` is plain JSON lines (appended to as answers come): gzip a finished file, not this one."""
    refuse_gzipped_output(out_path)
    max_prompt = target.config.max_seq_len - max_new_tokens
    wanted = {"train": train_per_domain, "val": val_per_domain}
    if isinstance(source, list):
        chosen = pick_from_file(source, wanted, max_prompt, tokenizer)
    else:
        chosen = pick_prompts(source, wanted, max_prompt, tokenizer, seed)
    if not chosen:
        raise ValueError("no train or val prompt to answer fits the target's context with the response cap")
    answered = answered_prompts(out_path)
    todo = [(i, c) for i, c in enumerate(chosen) if (c[0], c[1], tuple(c[2])) not in answered]
    params = SamplingParams(temperature=1.0)
    bar = tqdm(total=len(chosen), initial=len(chosen) - len(todo), desc="responses", unit="prompt")
    longest = max(
        len(ids) for _, _, ids in chosen
    )  # one cache as long as the longest request, for every batch
    context = longest + max_new_tokens  # a KV cache as long as the longest row needs
    with open(out_path, "a", encoding="utf-8") as f:
        for start in range(0, len(todo), batch_size):
            batch = [c for _, c in todo[start : start + batch_size]]
            # seeded by the first prompt's place in the whole selection: a resumed run repeats an uninterrupted one
            gen = torch.Generator().manual_seed(seed * 1_000_003 + todo[start][0])
            result = generate(
                target, [ids for _, _, ids in batch], max_new_tokens, params, gen, tokenizer.eos_id, context
            )
            for (domain, split, ids), response in zip(batch, result.tokens):
                record = {"domain": domain, "split": split, "prompt_ids": ids, "response_ids": response}
                f.write(json.dumps(record) + "\n")
            f.flush()
            bar.update(len(batch))
    bar.close()
    return len(chosen)


def load_responses(path: Path, split: str) -> list[dict]:
    """The records of one split ("train" or "val") of a responses file (plain or gzipped JSON lines).
    FileNotFoundError when it is missing, ValueError (one line) when it is not a responses file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} not found; run `python -m dspark.train responses` first")
    records = []
    try:
        with open_records(path) as f:
            for line in f:
                record = json.loads(line)
                record["split"], record["domain"], record["prompt_ids"], record["response_ids"]  # noqa: B018
                records.append(record)
    except (
        json.JSONDecodeError,
        TypeError,
        KeyError,
        gzip.BadGzipFile,
        zlib.error,
        EOFError,
        UnicodeDecodeError,
    ) as exc:
        raise ValueError(f"{path} line {len(records) + 1} is not a response record ({exc}); regenerate it with "
                         "`python -m dspark.train responses`") from None  # fmt: skip
    out = [r for r in records if r["split"] == split]
    missing = {d for d in DOMAINS} - {r["domain"] for r in out}
    if missing:
        raise ValueError(f"responses file has no {split} data for {sorted(missing)}")
    return out


def response_token_counts(records: list[dict], vocab_size: int) -> torch.Tensor:
    """(V,) how often the target wrote each id in these responses (what a draft vocabulary keeps)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in records:
        ids = torch.as_tensor(r["response_ids"], dtype=torch.long)
        counts += torch.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
    return counts
