"""What a drafter trains on: a padded batch of sequences with the frozen target's features of every token
(`FeatureBatch`), and the target's distribution p_t where a drafter is supervised (`supervised_target_probs`).

Where the features come from -- a cache on disk or a live target pass -- is the lab's
(dspark/lab/training/feature_cache.py); the loss that reads them is packed_blocks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark.drafters.base import TargetFeatures
from dspark.model import Transformer


@dataclass
class FeatureBatch:
    """A padded batch of training sequences and the frozen target's features of every token."""

    tokens: torch.Tensor  # (B, T) int64, right-padded with 0
    lengths: torch.Tensor  # (B,) prompt + response tokens of each row
    prompt_lens: torch.Tensor  # (B,) where each response starts
    taps: torch.Tensor  # (B, T, n_taps, dim) float32, residual stream after each tap layer
    last_hidden: torch.Tensor  # (B, T, dim) float32, final-normed hidden state (LM head input)
    lse: torch.Tensor | None = None  # (B, T) float32 log-sum-exp of the target's logits (None: not known)

    def to(self, device: torch.device) -> FeatureBatch:
        """The same batch with its tensors on `device`; lengths and prompt lengths stay on the host (the anchor
        sampler reads them there)."""
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return FeatureBatch(move(self.tokens), self.lengths, self.prompt_lens, move(self.taps),
                            move(self.last_hidden), move(self.lse))  # fmt: skip

    def flat_features(self) -> TargetFeatures:
        """Every position of every row, flattened: taps (B·T, n_taps, dim), last_hidden (B·T, dim)."""
        return TargetFeatures(self.taps.flatten(0, 1), self.last_hidden.flatten(0, 1))


def supervised_target_probs(
    target: Transformer, batch: FeatureBatch, ids: torch.Tensor | None = None, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """p_t only where a drafter is supervised: positions j in [P, L-2] of each row, whose next
    token is a response token (anchors.py). Returns (probs (N + 1, V) fp32, row_of (B, T) long):
    row_of[b, j] is the row of position j, or N -- an all-zero row -- where j is not supervised.
    With `ids` (K,) only p_t at those ids is kept, (N + 1, K) -- a draft vocabulary's -- still
    normalised over the whole vocabulary. Computed `chunk` rows at a time: a (N, V) fp32 tensor is
    never held (SmolLM2: 49k ids, 200 MB for a batch)."""
    B, T = batch.tokens.shape
    device = batch.tokens.device
    j = torch.arange(T, device=device)[None, :]
    prompt_lens, lengths = batch.prompt_lens.to(device), batch.lengths.to(device)
    need = (j >= prompt_lens[:, None]) & (j + 1 < lengths[:, None])  # (B, T)
    hidden = batch.last_hidden[need]  # (N, dim)
    pieces = []
    with torch.no_grad():
        if ids is not None and batch.lse is not None:  # K head rows and the known normaliser: no softmax
            rows, lse = target.lm_head.weight[ids], batch.lse[need]  # (K, dim), (N,)
            for start in range(0, hidden.shape[0], chunk):
                logits = F.linear(hidden[start : start + chunk].to(rows.dtype), rows).float()  # (n, K)
                pieces.append((logits - lse[start : start + chunk, None]).exp())
        else:
            for start in range(0, hidden.shape[0], chunk):
                logits = target.lm_head(
                    hidden[start : start + chunk].to(target.lm_head.weight.dtype)
                )  # (n, V)
                log_p = torch.log_softmax(logits.float(), dim=-1)
                pieces.append((log_p if ids is None else log_p[:, ids]).exp())
    width = target.config.vocab_size if ids is None else ids.shape[0]
    probs = torch.cat([*pieces, hidden.new_zeros(1, width, dtype=torch.float32)])  # (N + 1, V or K)
    row_of = torch.full((B, T), probs.shape[0] - 1, dtype=torch.long, device=device)
    row_of[need] = torch.arange(probs.shape[0] - 1, device=device)
    return probs, row_of
