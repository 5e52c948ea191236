"""What the lab's commands check before they call the core, with messages that name the bad item: prompts
(token ids, lengths), budgets and `bench serve`'s requests. The core's entry points
keep one short check each (`engine.check_inputs`); the user-facing detail lives here (sampling settings:
`cli.add_sampling`'s parsers).
"""

from __future__ import annotations

import math
import numbers

from dspark.engine import is_integer
from dspark.model import ModelConfig
from dspark.requests import Request


def check_token_ids(ids: list[int], vocab_size: int | None, what: str) -> None:
    """Raise ValueError unless every id of `ids` (host ints) is an integer in 0..vocab_size-1 (`what` names
    the list, e.g. "prompt 2"); torch would truncate a float or raise a bare IndexError."""
    for j, t in enumerate(ids, start=1):
        if not is_integer(t):
            raise ValueError(f"{what}: token {j} is {t!r}, not an integer token id")
    if ids and vocab_size is not None and not (0 <= min(ids) and max(ids) < vocab_size):
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(f"{what}: token id {bad} is outside the vocabulary 0..{vocab_size - 1}")


def check_max_new_tokens(max_new_tokens: object) -> None:
    """Raise ValueError unless the budget is an integer >= 1 (4.5 or True is refused, not rounded)."""
    if not is_integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_prompts(
    prompts: list[list[int]], context: int, vocab_size: int | None = None, names: list[str] | None = None
) -> None:
    """Raise ValueError for no prompts, an empty prompt, one with no room to generate, or (with `vocab_size`)
    a bad id. Prompts are numbered from 1, or called by `names` (e.g. "FILE line 3")."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("no prompts given" if not prompts else "prompts must be a list of token-id lists")
    for i, p in enumerate(prompts, start=1):
        name = names[i - 1] if names else f"prompt {i}"
        if not isinstance(p, (list, tuple)):
            raise ValueError(f"{name} is a {type(p).__name__}, not a list of token ids")
        if len(p) == 0:
            raise ValueError(f"{name} is empty")
        if len(p) >= context:
            raise ValueError(
                f"{name} is {len(p)} tokens; the model's context is {context} tokens "
                "and generation needs room for at least one more"
            )
        check_token_ids(p, vocab_size, name)


def check_requests(requests: list[Request], config: ModelConfig) -> None:
    """ValueError for malformed requests (ids, budget, arrival), numbered from 1; servable-but-bad ones (an
    empty prompt, no room) the engine rejects one by one (`Engine.rejection`)."""
    for i, request in enumerate(requests, start=1):
        if not isinstance(request.prompt, (list, tuple)):
            raise ValueError(
                f"request {i}: the prompt is a {type(request.prompt).__name__}, not a list of ids"
            )
        check_token_ids(request.prompt, config.vocab_size, f"request {i}")
        if not is_integer(request.max_new_tokens):
            raise ValueError(
                f"request {i}: max_new_tokens must be an integer, got {request.max_new_tokens!r}"
            )
        arrival = request.arrival
        seconds = isinstance(arrival, numbers.Real) and not isinstance(arrival, bool)
        if not seconds or not 0 <= arrival < math.inf:
            raise ValueError(
                f"request {i}: the arrival time must be a finite number of seconds >= 0, got {arrival!r}"
            )
