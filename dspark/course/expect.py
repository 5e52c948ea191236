"""How a check says what is wrong: `CheckFailed("...")`, and the helpers that raise it.

`expect_tensor`, `expect_equal`, `expect_close` and `expect_number` compare a value the student's
code returned (plain data, dspark/course/plain_data.py) with the right one and raise
`CheckFailed` with a one-line reason that shows both; NaN and inf never pass (`expect_tensor`
refuses non-finite floating tensors, `expect_number` non-finite numbers). `one_line` and
`printable` write every verdict and every line of the student's output that the report shows:
on one line, invisible characters escaped.

What this file does not do: run the student's code (dspark/course/checks.py calls it) or
decide a check's verdict from what it raised (dspark/course/framework.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from dspark.course.plain_data import NotPlainData


class CheckFailed(Exception):
    """The student's answer is wrong; the message says how, in one line."""


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, invisible characters escaped, at most `limit` characters."""
    text = printable(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(value: Any) -> str:
    """A short printable form of a tensor or list (floats rounded, long lists cut)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        value = value.double().round(decimals=4).tolist() if value.is_floating_point() else value.tolist()
    text = str(value)
    return text if len(text) <= 120 else text[:119] + "…"


def kind(value: Any) -> str:
    """The name of `value`'s type, as the student's code returned it ("ndarray", "float", ...)."""
    return value.type_name if isinstance(value, NotPlainData) else type(value).__name__


def expect_tensor(
    value: Any, name: str, shape: Iterable[int] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`value` must be a tensor (of this shape and dtype) and, if floating, hold no NaN or inf; returns it."""
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{name} should be a torch.Tensor, got {kind(value)}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"{name} has shape {tuple(value.shape)}, expected {tuple(shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CheckFailed(f"{name} has dtype {value.dtype}, expected {dtype}")
    if (value.is_floating_point() or value.is_complex()) and not bool(torch.isfinite(value).all()):
        raise CheckFailed(f"{name} contains NaN or inf: {show(value)}")
    return value


def expect_number(got: Any, expected: float, what: str, hint: str = "", atol: float = 1e-6) -> None:
    """`got` must be a finite number within `atol` of `expected` (NaN and inf never are)."""
    value = number(got, what)
    if not abs(value - expected) <= atol:
        raise CheckFailed(f"{what} = {value:.6g}, expected {expected:.6g}" + (f"; {hint}" if hint else ""))


def number(value: Any, what: str) -> float:
    """`value` (a Python number or a one-element tensor) as a finite float, else CheckFailed."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise CheckFailed(f"{what} should be a number, got {kind(value)}")
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise CheckFailed(f"{what} should be a number, got a tensor of shape {tuple(value.shape)}")
    try:
        result = float(value)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise CheckFailed(f"{what} should be a number, got {kind(value)}") from None
    if not math.isfinite(result):
        raise CheckFailed(f"{what} = {result}, which is never right: the answer is a finite number")
    return result


def expect_equal(actual: Any, expected: Any, what: str, hint: str = "") -> None:
    """Exact equality of tensors/lists/numbers; the message shows both and the hint."""
    same = (
        torch.equal(actual, expected)
        if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
        else actual == expected
    )
    if not same:
        raise CheckFailed(
            f"{what}: got {show(actual)}, expected {show(expected)}" + (f"; {hint}" if hint else "")
        )


def expect_close(
    actual: torch.Tensor, expected: torch.Tensor, what: str, atol: float = 1e-5, hint: str = ""
) -> None:
    """`actual` must have `expected`'s shape, hold no NaN or inf and lie within `atol` of it everywhere."""
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if not torch.isfinite(actual).all():
        raise CheckFailed(f"{what} contains NaN or inf: {show(actual)}" + (f"; {hint}" if hint else ""))
    gap = (actual.double() - expected.double()).abs()
    if gap.numel() and float(gap.max()) > atol:
        i = int(gap.flatten().argmax())
        raise CheckFailed(
            f"{what} differs from the expected value by {float(gap.max()):.3g} at flat index {i} "
            f"(got {float(actual.flatten()[i]):.5g}, expected {float(expected.flatten()[i]):.5g})"
            + (f"; {hint}" if hint else "")
        )


def printable(text: str) -> str:
    """`text` with control and other invisible characters written as escapes (\\x1b, \\r, ...)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
