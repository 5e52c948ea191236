"""Reference solution of assignment 1 (lossless verification), built on dspark/verify.py.

`verify` is `dspark.verify.verify_reference`; `residual` is the distribution that
function draws a replacement from after a rejection (DESIGN §8).
What this file does not do: anything beyond adapting signatures.
"""

from __future__ import annotations

import torch

from dspark.verify import verify_reference


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)) over the last dimension; p where that has no mass."""
    rest = (p - q).clamp_min(0.0)
    mass = rest.sum(-1, keepdim=True)
    return torch.where(mass > 0, rest / mass.clamp_min(1e-30), p)


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    accept_uniforms: torch.Tensor,
    resample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    result = verify_reference(
        draft_tokens, draft_probs, target_probs, verify_lens, accept_uniforms, resample_uniforms
    )
    return result.accepted, result.next_token
