"""Where drafters are supervised: anchor positions, drawn from the response only.

A training sequence is prompt + the target's own response, tokens 0..L-1 with
the response starting at P (= the prompt's length). At inference the anchor
of a draft block is always a token the target produced (the first one is the
token sampled after the prompt's prefill, at position P), and the block drafts
the tokens after it. Training supervises exactly those situations
(walkthrough/DESIGN.md section 3; paper section 3.3, as the reference trainer
does):

  * an anchor is a response position a in [P, L-2]: a response token with at
    least one response token after it to predict (tokens a+1 .. a+γ that exist);
  * per sequence at most `density` anchors, drawn WITHOUT repeats (density 0 =
    every candidate: each response position anchors one block per epoch);
  * rows with fewer anchors than the widest row are padded, the padding masked.

`anchor_counts` is the budget side of the same rule: one epoch over supervised
positions = every candidate anchor of the training set used once, whatever the
drafter (MTP-1 and EAGLE-3 supervise every candidate of a sequence in one pass,
the parallel drafters `density` of them per pass).

What this file does not do: build the blocks (dspark/training.py).
"""

from __future__ import annotations

import torch


def candidate_counts(lengths: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
    """(B,) number of possible anchors per sequence: response positions a with a + 1 < L."""
    return (lengths - 1 - prompt_lens).clamp(min=0)


def sample_anchors(
    lengths: torch.Tensor, prompt_lens: torch.Tensor, density: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchors (B, A), valid (B, A)): up to `density` distinct response anchors per sequence
    (0 = all of them), sorted; padding slots hold the first candidate (or 0) and valid=False.

    lengths (B,) prompt + response tokens, prompt_lens (B,) where the response starts."""
    if density < 0:
        raise ValueError(f"anchor density must be >= 0 (0 = every response position), got {density}")
    counts = candidate_counts(lengths, prompt_lens).tolist()
    picks = []
    for n, start in zip(counts, prompt_lens.tolist()):
        order = torch.randperm(n, generator=generator, device=generator.device)
        take = order if density == 0 else order[:density]
        picks.append(start + take.sort().values.to(lengths.device))
    width = max([len(p) for p in picks] + [1])
    anchors = torch.zeros(len(picks), width, dtype=torch.long, device=lengths.device)
    valid = torch.zeros(len(picks), width, dtype=torch.bool, device=lengths.device)
    for b, p in enumerate(picks):
        anchors[b, : len(p)] = p
        anchors[b, len(p) :] = p[0] if len(p) else 0
        valid[b, : len(p)] = True
    return anchors, valid


def every_anchor(lengths: torch.Tensor, prompt_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_anchors` at density 0 without drawing anything: every candidate, in order."""
    counts = candidate_counts(lengths, prompt_lens)
    width = max(int(counts.max()) if len(counts) else 0, 1)
    offset = torch.arange(width, device=lengths.device)[None, :]
    valid = offset < counts[:, None]
    return torch.where(valid, prompt_lens[:, None] + offset, prompt_lens[:, None].clamp(max=0)), valid


def anchor_counts(lengths: torch.Tensor, prompt_lens: torch.Tensor, density: int) -> torch.Tensor:
    """(B,) anchors `sample_anchors` draws per sequence (no randomness: min(density, candidates))."""
    counts = candidate_counts(lengths, prompt_lens)
    return counts if density == 0 else counts.clamp(max=density)
