"""A static, preallocated key/value cache for a batch of requests ("slots").

Layout (gpt-fast style, but ragged):

    keys, values : (n_layers, n_slots, n_kv_heads, max_seq_len, head_dim)
    lengths      : (n_slots,) int64   -- how many positions of each slot are valid

      slot 0 | k0 k1 k2 k3 k4 . . . . . |  length 5
      slot 1 | k0 k1 . . . . . . . . . . |  length 2
      slot 2 | (free)                    |  length 0

A forward pass appends a *block* of tokens to each participating slot (a whole
prompt at prefill, one token when decoding, anchor + drafts when verifying);
every slot's block may have a different length. The model writes the new
keys/values at positions `lengths[slot] + 0..block_len-1` and then calls
`advance`. Rolling back after rejected drafts is just lowering `lengths`: the
stale entries beyond the length are never read and get overwritten later.

Everything lives on the `device` given at construction (`Transformer.new_cache` passes
the model's). The hot paths never call `rollback`, which reads the length back
to the host: a pass checks the room in its ragged index (`model.RaggedIndex`)
and the engine rolls back all requests at once by writing `lengths[slots]` on
the device.

What this file does not do: attention itself (see `model.py`), or paging.
"""

from __future__ import annotations

import torch

from dspark.device import to_host


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
    def for_model(cls, config, n_slots: int, dtype: torch.dtype = torch.float32, device="cpu"):
        """A cache shaped for a `ModelConfig`."""
        return cls(
            config.n_layers,
            n_slots,
            config.n_kv_heads,
            config.max_seq_len,
            config.head_dim,
            dtype,
            device,
        )

    @property
    def n_slots(self) -> int:
        return self.lengths.shape[0]

    @property
    def n_free(self) -> int:
        return len(self._free)

    # ---- slot ownership -----------------------------------------------------
    def allocate(self) -> int:
        """Claim a free slot (length 0) for a new request."""
        if not self._free:
            raise RuntimeError(f"all {self.n_slots} KV-cache slots are in use")
        slot = self._free.pop(0)
        self._in_use.add(slot)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        """Give a slot back; its contents become garbage to be overwritten."""
        if slot not in self._in_use:
            raise ValueError(f"slot {slot} is not allocated")
        self._in_use.remove(slot)
        self.lengths[slot] = 0
        self._free.append(slot)
        self._free.sort()

    # ---- lengths --------------------------------------------------------------
    def advance(self, slots: torch.Tensor, block_lens: torch.Tensor) -> None:
        """Mark `block_lens` more positions of each slot in `slots` as valid."""
        self.lengths[slots] += block_lens

    def rollback(self, slot: int, new_length: int) -> None:
        """Forget everything of `slot` from position `new_length` on."""
        current = to_host(self.lengths[slot], "kv cache: check a rollback")  # host sync: the check below
        if not 0 <= new_length <= current:
            raise ValueError(f"cannot roll slot {slot} back to {new_length} (length {current})")
        self.lengths[slot] = new_length

    def reset(self) -> None:
        """Free every slot."""
        self.lengths.zero_()
        self._free = list(range(self.n_slots))
        self._in_use.clear()
