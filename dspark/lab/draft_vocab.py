"""A reduced draft vocabulary: a drafter that scores only the K ids the target writes most often.

    U = LMHead_K(h)       the target's frozen head rows of those ids   (K,)
    q over the K ids,     q = 0 for every other id

Still lossless: `expand` writes q into the full vocabulary with zeros elsewhere, so an id off the K is
never drafted, but the residual max(p - q, 0) gives it its full probability on a rejection. `to_draft`
maps every id off the K to one extra index K ("other"), so any anchor has a row in W1.

The core's drafters score the target's whole vocabulary; `ReducedParallelDrafter` and
`ReducedAutoregressiveDrafter` subclass them to score a `DraftVocabulary`, and `build_drafter` /
`load_checkpoint` pick them when a config's `draft_vocab` is K > 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dspark.checkpoint import CheckpointError, read_checkpoint
from dspark.drafters import drafter_config, trained_for, with_weights
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter, Proposal
from dspark.drafters.parallel import HEADS, ParallelDrafter, ParallelDrafterConfig
from dspark.lab.cpu_speed import VocabHead, project_to_vocab
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


class DraftVocabulary(nn.Module):
    """The K draft ids (`ids`, saved with the drafter) and the maps between draft indices and target ids."""

    def __init__(self, target: Transformer, size: int) -> None:
        super().__init__()
        self._target = (target,)  # frozen and shared: its head rows are read, never trained
        self.target_vocab = V = target.config.vocab_size
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
        rows = self.head_rows.to(normed.dtype)  # the lab's CPU projection where the target's head takes it
        fast = isinstance(self._target[0].lm_head, VocabHead)
        return project_to_vocab(normed, rows) if fast else F.linear(normed, rows)

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


class ReducedParallelDrafter(ParallelDrafter):
    """The core's parallel drafter scoring a `DraftVocabulary`: U over K ids, its head's W1 with a row per draft
    index and "other" (K + 1), W2 with K; tokens and anchors leave and enter as target ids."""

    def __init__(self, target: Transformer, config: ParallelDrafterConfig) -> None:
        super().__init__(target, config)
        self.vocab = DraftVocabulary(target, config.draft_vocab)
        if (
            self.head is not None
        ):  # the core's head has a row per target id: one over the draft indices instead
            self.head = HEADS[config.head](
                self.vocab.n_prev, self.vocab.n_out, target.config.dim, config.rank
            )
            for m in self.head.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
            nn.init.zeros_(self.head.w2.weight)

    def block_outputs(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.out_norm(h)
        return normed, self.vocab.logits(normed)

    def sample_head(self, u, h, anchors, params, uniforms):
        tokens, q, conf = super().sample_head(u, h, self.vocab.to_draft(anchors), params, uniforms)
        return self.vocab.to_target(tokens), q, conf

    def propose(self, *args) -> ReducedProposal:
        return ReducedProposal(**vars(super().propose(*args)), vocab=self.vocab)


@dataclass
class ReducedProposal(Proposal):
    """A proposal whose q_k is over the K ids of `vocab` (None: over all V); `probs` puts it on the V target ids
    (built on each read), zero for the ids no draft can be."""

    vocab: DraftVocabulary | None = None

    @property
    def probs(self) -> torch.Tensor:
        return self.q if self.vocab is None else self.vocab.expand(self.q)


class ReducedAutoregressiveDrafter(AutoregressiveDrafter):
    """The core's MTP / EAGLE drafter scoring a `DraftVocabulary`: q over K ids, drafts fed back as target ids."""

    def __init__(self, target: Transformer, config: AutoregressiveDrafterConfig) -> None:
        super().__init__(target, config)
        self.vocab = DraftVocabulary(target, config.draft_vocab)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.vocab.logits(self.out_norm(g))

    def next_token(self, g, params, generator):
        x, q = super().next_token(g, params, generator)
        return self.vocab.to_target(x), q

    def propose(self, *args) -> Proposal:
        proposal = super().propose(*args)
        if not proposal.tokens.shape[1]:  # γ = 0: nothing drawn over the K ids
            return proposal
        return ReducedProposal(**vars(proposal), vocab=self.vocab)


def build_drafter(
    target: Transformer, config: ParallelDrafterConfig | AutoregressiveDrafterConfig
) -> Drafter:
    """A fresh drafter of `config` for `target`: the core's, or with `draft_vocab` K > 0 its reduced subclass."""
    if isinstance(config, ParallelDrafterConfig):
        return (ReducedParallelDrafter if config.draft_vocab else ParallelDrafter)(target, config)
    return (ReducedAutoregressiveDrafter if config.draft_vocab else AutoregressiveDrafter)(target, config)


def load_checkpoint(path: str | Path, target: Transformer) -> Drafter:
    """The core's `load_drafter`, a reduced draft vocabulary included."""
    record, tensors = read_checkpoint(path)
    config = drafter_config(path, record)
    try:
        drafter = build_drafter(target, config)
    except (AttributeError, TypeError, ValueError) as exc:
        raise CheckpointError(f"drafter config of {path} is invalid ({exc}){trained_for(record)}") from None
    return with_weights(drafter, target, path, record, tensors)


class WholeVocabulary:
    """What a core drafter scores, in `DraftVocabulary`'s terms (for the exporters): the target's V ids, each
    its own draft index."""

    size = 0  # no reduced vocabulary

    def __init__(self, target: Transformer) -> None:
        self._target = (target,)
        self.target_vocab = self.n_out = self.n_prev = target.config.vocab_size

    def output_rows(self) -> torch.Tensor:
        """(V, dim): the target's LM-head rows."""
        return self._target[0].lm_head.weight.detach()

    def to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        return ids


def draft_vocabulary(drafter) -> DraftVocabulary | None:
    """The drafter's draft vocabulary, or None when it scores the target's whole vocabulary."""
    vocab = getattr(drafter, "vocab", None)
    return vocab if isinstance(vocab, DraftVocabulary) else None


def vocab_of(drafter) -> DraftVocabulary | WholeVocabulary:
    """The drafter's draft vocabulary, or its whole one (`WholeVocabulary`)."""
    return draft_vocabulary(drafter) or WholeVocabulary(drafter.target)
