"""How sure a τ comparison is: per-prompt counts and a paired bootstrap of macro-τ ratios.

τ of a drafter on a domain is committed tokens over request-rounds, pooled over
that domain's prompts; the macro τ is the mean over domains (paper Table 1).
Two drafters measured on the *same* prompts are paired: a prompt that is easy
to draft (a long list, a repeated identifier) is easy for both. So the
interval of the ratio macro τ(A) / macro τ(B) resamples prompts -- the same
draws for A and B, within each domain -- and recomputes the pooled τ of each
domain, the macro averages and their ratio (percentile interval). Rounds are
not resampled one by one: the rounds of one prompt are strongly correlated.

`prompt_counts` gives what a benchmark row stores to make this possible
(`bench offline` writes `prompt_tokens` / `prompt_rounds` into every row);
`rows_of_runs` pairs the rows of separate runs (`bench ratios`): a drafter
trained later against those whose checkpoints are gone but whose JSON is
committed.

What this file does not do: measure anything (dspark/lab/study/offline.py) or
format tables (dspark/lab/study/tables.py).
"""

from __future__ import annotations

import torch

from dspark.requests import RoundStats


def prompt_counts(stats: RoundStats) -> tuple[list[int], list[int]]:
    """(committed tokens, request-rounds) of each request of `stats`, in its request order."""
    return [sum(e) for e in stats.emitted], [len(a) for a in stats.accepted]


def macro_tau_ratio(
    a_rows: dict[str, dict], b_rows: dict[str, dict], draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(ratio, 2.5th, 97.5th percentile) of macro τ(A) / macro τ(B).

    a_rows / b_rows: per domain, a row with `prompt_tokens` and `prompt_rounds` (one entry per prompt, the
    same prompts in the same order for A and B). Prompts are resampled with replacement within each domain,
    the same indices for both drafters."""
    if set(a_rows) != set(b_rows) or not a_rows:
        raise ValueError("both drafters need rows for the same, non-empty set of domains")
    g = torch.Generator().manual_seed(seed)
    points: dict[str, list] = {"a": [], "b": []}  # per domain: pooled τ
    boots: dict[str, list] = {"a": [], "b": []}  # per domain: (draws,) pooled τ of each resample
    for domain in a_rows:
        n = len(a_rows[domain]["prompt_tokens"])
        if n != len(b_rows[domain]["prompt_tokens"]) or n == 0:
            raise ValueError(f"{domain}: the two drafters must be measured on the same prompts")
        idx = torch.randint(0, n, (draws, n), generator=g)  # (draws, prompts), shared by A and B
        for side, rows in (("a", a_rows), ("b", b_rows)):
            tokens = torch.tensor(rows[domain]["prompt_tokens"], dtype=torch.float64)
            rounds = torch.tensor(rows[domain]["prompt_rounds"], dtype=torch.float64)
            points[side].append(tokens.sum() / rounds.sum())
            boots[side].append(tokens[idx].sum(1) / rounds[idx].sum(1).clamp(min=1))
    ratio = torch.stack(points["a"]).mean() / torch.stack(points["b"]).mean()
    boot = torch.stack(boots["a"]).mean(0) / torch.stack(boots["b"]).mean(0)  # (draws,) macro ratio
    low, high = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return ratio.item(), low, high


def ratio_rows(rows: list[dict], draws: int = 2000) -> list[dict]:
    """For every temperature and every ordered pair of drafters (A listed before B) in `rows` (benchmark
    rows with per-prompt counts; plain decoding's rows are skipped): the macro-τ ratio A / B and its 95%
    paired bootstrap interval."""
    out = []
    for temperature in dict.fromkeys(r["temperature"] for r in rows):
        by_drafter: dict[str, dict[str, dict]] = {}
        for r in rows:
            if r["temperature"] == temperature and r["drafter"] != "none" and "prompt_tokens" in r:
                by_drafter.setdefault(r["drafter"], {})[r["domain"]] = r
        names = list(by_drafter)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                ratio, low, high = macro_tau_ratio(by_drafter[a], by_drafter[b], draws)
                out.append({"temperature": temperature, "a": a, "b": b, "ratio": ratio, "low": low,
                            "high": high})  # fmt: skip
    return out


def rows_of_runs(records: list[dict]) -> list[dict]:
    """The rows of several `bench offline` records (their JSON) as one list for `ratio_rows`, so that a drafter
    measured in one run (a later session's) is compared with those of another on the same prompts. A label
    already taken by an earlier record becomes `label@N` (N: the record's 1-based position), which also pairs
    a drafter with its own re-measurement (a ratio near 1 says the runs agree). The pairing is over prompts,
    as within one run; only the sampling draws differ between runs (independent instead of shared), which
    widens no interval that a shared draw would have narrowed much (τ's spread is mostly between prompts).

    Raises ValueError when a record is not an offline run with per-prompt counts or the records were
    measured on different prompts (prompt set, prompts per domain, tokens of generation)."""
    if not records:
        raise ValueError("no runs given")
    keys = ("prompts", "prompts_measured", "max_new_tokens")
    out: list[dict] = []
    taken: set[str] = set()
    for i, record in enumerate(records, start=1):
        if record.get("benchmark") != "offline":
            raise ValueError(f"run {i} is a `bench {record.get('benchmark')}` record, not `bench offline`")
        for key in keys:
            if record.get(key) != records[0].get(key):
                raise ValueError(f"run {i} measured other prompts than run 1 ({key}: {record.get(key)!r} "
                                 f"against {records[0].get(key)!r})")  # fmt: skip
        rows = [r for r in record["results"] if r["drafter"] != "none"]
        if any("prompt_tokens" not in r for r in rows):
            raise ValueError(
                f"run {i} has no per-prompt counts (measured before `bench offline` stored them)"
            )
        names = {
            r["drafter"]: r["drafter"] if r["drafter"] not in taken else f"{r['drafter']}@{i}" for r in rows
        }
        out += [r | {"drafter": names[r["drafter"]]} for r in rows]
        taken |= set(names.values())
    return out
