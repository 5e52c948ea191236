"""A static, preallocated key/value cache for a batch of requests ("slots").

Layout (gpt-fast style, but ragged):

    keys, values : (n_layers, n_slots, n_kv_heads, max_seq_len, head_dim)
    lengths      : (n_slots,) int64   -- how many positions of each slot are valid

      slot 0 | k0 k1 k2 k3 k4 . . . . . |  length 5
      slot 1 | k0 k1 . . . . . . . . . . |  length 2
      slot 2 | (free)                    |  length 0

A pass writes each slot's block (a prompt, one token, or anchor + drafts) at `lengths[slot] + 0..len-1`,
then calls `advance`. Rolling back rejected drafts is just lowering `lengths`: stale entries are never read.
Hot paths never call `rollback` (a host read); the engine writes `lengths[slots]` on the device."""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, n_slots, n_kv_heads, max_seq_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(n_slots, dtype=torch.long, device=device)
        self.max_seq_len = max_seq_len
        self._free = list(range(n_slots))  # slots not owned by any request
        self._in_use: set[int] = set()

    @classmethod
    def for_model(cls, c, n_slots: int, dtype: torch.dtype = torch.float32, device="cpu") -> KVCache:
        """A cache shaped for a `ModelConfig` c."""
        return cls(c.n_layers, n_slots, c.n_kv_heads, c.max_seq_len, c.head_dim, dtype, device)

    @property
    def n_slots(self) -> int:
        return self.lengths.shape[0]

    @property
    def n_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """Claim a free slot (length 0) for a new request."""
        assert self._free, f"all {self.n_slots} KV-cache slots are in use"
        slot = self._free.pop(0)
        self._in_use.add(slot)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        """Give a slot back; its contents become garbage to be overwritten."""
        assert slot in self._in_use, f"slot {slot} is not allocated"
        self._in_use.remove(slot)
        self.lengths[slot] = 0
        self._free.append(slot)
        self._free.sort()

    def advance(self, slots: torch.Tensor, block_lens: torch.Tensor) -> None:
        """Mark `block_lens` more positions of each slot in `slots` as valid."""
        self.lengths[slots] += block_lens

    def rollback(self, slot: int, new_length: int) -> None:
        """Forget everything of `slot` from position `new_length` on (it cannot grow: a host read)."""
        assert 0 <= new_length <= self.lengths[slot], f"cannot roll slot {slot} back to {new_length}"
        self.lengths[slot] = new_length
