"""Bug: max_new_tokens is checked once per block, after all of it was emitted, so a request
overshoots its limit inside a block. Caught by `emit_stops_at_eos_and_the_limit` and
`max_new_tokens_inside_a_block`."""

from __future__ import annotations

import a2_solution


def emit(emitted, new_tokens, max_new_tokens, eos_id):
    for token in new_tokens:
        emitted.append(token)
        if token == eos_id:
            return True
    return len(emitted) >= max_new_tokens  # BUG: the block was emitted whole


a2_solution.emit = emit
speculative_generate = a2_solution.speculative_generate
