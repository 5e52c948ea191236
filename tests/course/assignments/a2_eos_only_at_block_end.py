"""Bug: EOS is noticed only when it is the last token of the emitted block, so an EOS inside a
block is emitted and decoding goes on. Caught by `emit_stops_at_eos_and_the_limit` and
`eos_inside_a_block`."""

from __future__ import annotations

import a2_solution


def emit(emitted, new_tokens, max_new_tokens, eos_id):
    for token in new_tokens:
        emitted.append(token)
        if len(emitted) >= max_new_tokens:
            return True
    return eos_id is not None and emitted[-1] == eos_id  # BUG: an EOS inside the block is missed


a2_solution.emit = emit
speculative_generate = a2_solution.speculative_generate
