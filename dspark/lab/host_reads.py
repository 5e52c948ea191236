"""Counting device-to-host reads: the lab's instrumentation of the core's hot paths.

A read (`Tensor.tolist`, `.item`, `int(t)`, `float(t)`, `bool(t)`) waits for the device: on a GPU every one
stalls the pipeline, so the core reads only where the host must decide (a shape, a stop) and marks each
`# host sync`. `HostReads` counts them from outside, by the function that read, while it is active; with
`engine` given it also counts per engine step and in prefill, by wrapping that engine's phases.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable

import torch

READS = ("tolist", "item", "__int__", "__float__", "__bool__")  # every way Python code reads a tensor's value


class HostReads:
    """`with HostReads(engine) as reads: engine.run(...)`: `reads.by_function`, `reads.per_step` (one count per
    engine step), `reads.prefill` (all prefill passes together)."""

    def __init__(self, engine: object | None = None) -> None:
        self.engine = engine
        self.by_function: Counter[str] = Counter()
        self.per_step: list[int] = []
        self.prefill = 0
        self._saved: dict[str, Callable] = {}

    @property
    def total(self) -> int:
        return sum(self.by_function.values())

    def _counted(self, original: Callable) -> Callable:
        def read(tensor: torch.Tensor, *args, **kwargs):
            caller = sys._getframe(1)
            self.by_function[f"{caller.f_globals.get('__name__')}.{caller.f_code.co_name}"] += 1
            return original(tensor, *args, **kwargs)

        return read

    def _phase(self, method: Callable, into: Callable[[int], None]) -> Callable:
        def counted(*args, **kwargs):
            before = self.total
            out = method(*args, **kwargs)
            into(self.total - before)
            return out

        return counted

    def __enter__(self) -> HostReads:
        for name in READS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counted(self._saved[name]))
        if self.engine is not None:  # a step is `step` then `commit`: both counted into the step's entry
            e = self.engine
            e.prefill = self._phase(e.prefill, lambda n: setattr(self, "prefill", self.prefill + n))
            e.step = self._phase(e.step, self.per_step.append)
            e.commit = self._phase(e.commit, lambda n: self.per_step.__setitem__(-1, self.per_step[-1] + n))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        if self.engine is not None:
            for phase in ("prefill", "step", "commit"):
                vars(self.engine).pop(phase, None)
