"""A reduced draft vocabulary: a drafter that scores only the K ids the target writes most often.

    U = LMHead_K(h)       the target's frozen head rows of those ids   (K,)
    q over the K ids,     q = 0 for every other id

Still lossless: `expand` writes q into the full vocabulary with zeros elsewhere, so an id off the K is
never drafted, but the residual max(p - q, 0) gives it its full probability on a rejection. `to_draft`
maps every id off the K to one extra index K ("other"), so any anchor has a row in W1.

The core's drafters score the whole vocabulary (`dspark.drafters.base.Vocabulary`); this subclass is
handed to them by the lab's builders and loaders when a config's `draft_vocab` is K > 0.
"""

from __future__ import annotations

import torch

from dspark.drafters.base import Vocabulary
from dspark.model import Transformer


def most_frequent(counts: torch.Tensor, size: int, keep: tuple[int, ...] = ()) -> torch.Tensor:
    """The `size` ids with the highest counts (V,), most frequent first, always including `keep` (e.g. EOS)."""
    if not 0 < size <= counts.shape[0]:
        raise ValueError(f"draft vocabulary size must be in 1..{counts.shape[0]}, got {size}")
    order = torch.argsort(counts.double(), descending=True, stable=True)  # ties: the lower id first
    forced = torch.tensor(
        [i for i in keep if 0 <= i < counts.shape[0]], dtype=torch.long, device=counts.device
    )
    rest = order[~torch.isin(order, forced)][: size - forced.shape[0]]
    return torch.cat([forced, rest.long()])


class DraftVocabulary(Vocabulary):
    """The K draft ids (`ids`, saved with the drafter) and the maps between draft indices and target ids."""

    def __init__(self, target: Transformer, size: int) -> None:
        super().__init__(target)
        V = target.config.vocab_size
        if not 0 < size <= V:
            raise ValueError(f"a draft vocabulary has 1..{V} ids, got {size}")
        self.size, self.n_out, self.n_prev = size, size, size + 1  # + 1: "other", every id off the K
        device = target.embed.weight.device
        self.register_buffer("ids", torch.arange(size, device=device))  # (K,) target id of each draft index
        self.register_buffer(
            "to_draft_index", torch.empty(V, dtype=torch.long, device=device), persistent=False
        )
        self.register_buffer("head_rows", torch.empty(0, device=device), persistent=False)  # (K, dim)
        self.register_load_state_dict_post_hook(lambda module, keys: module.refresh())
        self.refresh()

    def set_ids(self, ids: torch.Tensor) -> None:
        """Use these target ids (K distinct, in 0..V-1) as the draft vocabulary."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.ids.device).flatten()
        self._check(ids)
        self.ids.copy_(ids)
        self.refresh()

    def _check(self, ids: torch.Tensor) -> None:
        """K distinct ids in 0..V-1, or ValueError (for `set_ids`, and for ids loaded from a checkpoint)."""
        distinct = ids.unique().shape[0]
        if ids.shape[0] != self.size or distinct != self.size:
            raise ValueError(f"need {self.size} distinct ids, got {ids.shape[0]} ({distinct} distinct)")
        if ids.min() < 0 or ids.max() >= self.target_vocab:
            raise ValueError(f"draft ids must be in 0..{self.target_vocab - 1}")

    def refresh(self) -> None:
        """Recompute the id map and the head rows from `ids` (after loading or setting them)."""
        head = self._target[0].lm_head.weight
        self._check(self.ids)
        self.to_draft_index = torch.full(
            (self.target_vocab,), self.size, dtype=torch.long, device=self.ids.device
        )
        self.to_draft_index[self.ids] = torch.arange(self.size, device=self.ids.device)
        self.head_rows = head.detach()[self.ids.to(head.device)].clone()

    def output_rows(self) -> torch.Tensor:
        """(K, dim): the target's frozen LM-head row of every draft index."""
        return self.head_rows

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """(..., dim) -> (..., K): the target's frozen LM head, restricted to the draft ids."""
        return self._target[0].project_to_vocab(normed, self.head_rows.to(normed.dtype))

    def to_draft(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft indices (K for an id outside the draft vocabulary)."""
        return self.to_draft_index[target_ids]

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft indices (< K) -> target ids."""
        return self.ids[draft_ids]

    def expand(self, probs: torch.Tensor) -> torch.Tensor:
        """(..., K) draft probabilities -> (..., V) over the target's vocabulary, zero off the draft ids."""
        out = probs.new_zeros(*probs.shape[:-1], self.target_vocab)
        return out.scatter_(-1, self.ids.expand_as(probs), probs)  # scatter_: faster than index_copy_ here

    def restrict(self, probs: torch.Tensor) -> torch.Tensor:
        """(..., V) target probabilities -> (..., K) at the draft ids (the mass elsewhere is dropped)."""
        return probs[..., self.ids]


def vocabulary(target: Transformer, size: int) -> Vocabulary | None:
    """What a drafter of `draft_vocab` = size scores: a DraftVocabulary of K ids, or None (the whole one)."""
    return DraftVocabulary(target, size) if size else None
