"""Logits -> fp32 probabilities -> tokens, the one place where this happens.

`probabilities` applies `SamplingParams` (temperature, top-k, top-p); `sample_from_probs` draws by inverse
CDF from uniforms the caller supplies. Drafting and verification must use exactly these tensors: a token
sampled from one distribution and judged with another breaks losslessness. Temperature 0 is a one-hot
argmax (ties to the lowest id), so greedy shares every code path. Sampling reads nothing back to the host
(top-p's `nucleus` does, once)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark.device import generator_uniforms


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (argmax); else logits / T, T >= 1e-6 (smaller overflows fp32)
    top_k: int = 0  # keep only the k most likely tokens (0 = all)
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p (1 = all)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) fp32 probabilities after temperature/top-k/top-p."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if params.temperature != 1.0:
        logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        probs = nucleus(probs, params.top_p)
    return probs


def nucleus(probs: torch.Tensor, top_p: float, first: int = 256) -> torch.Tensor:
    """(..., V) probs kept on the smallest set of best tokens whose mass reaches `top_p`, renormalised.
    A top-`first` is far cheaper than sorting the vocabulary; rows whose nucleus is wider are sorted whole."""
    flat = probs.reshape(-1, probs.shape[-1])  # (N, V)
    kept = torch.zeros_like(flat)

    def keep_ranked(rows: torch.Tensor, best: torch.Tensor, order: torch.Tensor) -> None:
        mass_before = best.cumsum(-1) - best  # mass of strictly better tokens; the top token always survives
        kept[rows] = (
            torch.zeros_like(best[:, :1])
            .expand(-1, flat.shape[-1])
            .scatter(-1, order, best * (mass_before < top_p))
        )

    best, order = flat.topk(min(first, flat.shape[-1]), dim=-1)  # descending
    wide = best.sum(-1) < top_p
    keep_ranked(~wide, best[~wide], order[~wide])
    if bool(wide.any()):
        keep_ranked(wide, *flat[wide].sort(dim=-1, descending=True))
    return (kept / kept.sum(-1, keepdim=True)).reshape(probs.shape)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: (..., V) probs and (...) uniforms in [0, 1) -> (...) ids. Never returns a
    zero-probability token (right-sided search, capped at the last positive token)."""
    cdf = probs.float().cumsum(-1)
    target = uniforms.float().unsqueeze(-1) * cdf[..., -1:]
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    V = probs.shape[-1]
    chosen = probs.gather(-1, idx.clamp(max=V - 1).unsqueeze(-1)).squeeze(-1)
    stray = (idx >= V) | (chosen <= 0)  # u·total rounded onto/past the end
    # applied everywhere (a no-op where nothing strays): no host sync to ask whether to
    last_positive = V - 1 - (probs > 0).flip(-1).float().argmax(-1)
    return torch.where(stray, torch.minimum(idx, last_positive), idx)


def draw_token(probs: torch.Tensor, uniforms: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """`sample_from_probs(probs, uniforms)`; at temperature 0 the one-hot's argmax, without the cumsum."""
    return probs.argmax(-1) if params.greedy else sample_from_probs(probs, uniforms)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(..., V) probs -> (...) ids, uniforms drawn on `generator`'s device (same seed, same tokens on every
    device)."""
    return sample_from_probs(probs, generator_uniforms(tuple(probs.shape[:-1]), generator, probs.device))
