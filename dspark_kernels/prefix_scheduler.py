"""The prefix scheduler on the device: confidences → survivals → Algorithm 1 → verify lengths.

What it computes (paper §3.2.2 and Algorithm 1; walkthrough/DESIGN.md section 5): for R
requests with γ draft confidences each,

  1. optional STS calibration  c̃_{r,j} = σ(logit(c_{r,j}) / T_j - b_j)  (b_j = 0 without offsets),
  2. prefix survivals          a_{r,j} = Π_{i<=j} c̃_{r,i}   (a cumulative product along γ),
  3. the greedy path           every (r, j) in descending a; ties: smaller j first, then smaller r,
  4. the rate along the path   Θ_n = (R + a_(1) + ... + a_(n)) · SPS(R + n), n = 0..R·γ,
     with SPS looked up in the measured table (beyond it: SPS(M)·M/B),
  5. how many to admit         early stop: the leading run of steps where Θ strictly improves;
                               retrospective: the first global argmax of Θ (lossy, Appendix A);
                               budget K: exactly min(K, R·γ),
  6. lengths                   ℓ_r = how many of request r's drafts were admitted.

All of it runs in ONE program on one tile, so the per-request lengths are
produced on the device with no host round-trip in between (the host version
walks the path in a Python loop).

The reference is `prefix_schedule(prefix_survival(confidences, temperatures), ...)`
in `dspark/scheduler.py`; the tests compare the two (this file imports nothing of
dspark: dspark_kernels/ is a leaf). The kernel's arithmetic is fp32 while the reference works in
float64, so they agree exactly except at near-ties: two survivals, or two
consecutive Θ, closer than fp32 can resolve may compare differently (for
instance a calibrated sure draft, σ(logit(1 - 1e-12) / T), is exactly 1 in
fp32 for T <= ~1.6, and a 1e-12 gain does not change an fp32 τ).

What it does not do: the asynchronous variant's two-rounds-old budget search
(`AsyncPrefixPolicy` computes K; this kernel then only applies it), and tiles
larger than MAX_TILE elements (`dspark.scheduler.Scheduler.__call__` falls back
to the reference there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TILE = 4096  # next_pow2(R) · next_pow2(γ): everything is sorted inside one program
MODE_EARLY_STOP, MODE_RETROSPECTIVE, MODE_BUDGET = 0, 1, 2


@triton.jit
def _sps(sps_ptr, B, M, mask):
    """SPS(B) for a block of batch sizes B >= 1: the table entry B-1, or SPS(M)·M/B beyond it."""
    inside = tl.load(sps_ptr + tl.minimum(B, M) - 1, mask=mask, other=1.0)
    return tl.where(B <= M, inside, inside * M / B)  # fp32 · int / int stays fp32


@triton.jit(do_not_specialize=["R", "GAMMA", "M", "budget"])  # no recompiles for R = 1 etc.
def _prefix_schedule_kernel(
    conf_ptr,  # (R, γ) fp32 draft confidences, row-major contiguous
    temp_ptr,  # (γ',) fp32 STS temperatures, or (2, γ') temperatures then logit offsets; γ' >= γ
    temp_stride,  # γ': where the offsets start (ignored unless USE_SHIFT)
    sps_ptr,  # (M,) fp32 SPS table: entry B-1 is steps/second with B tokens in a pass
    out_ptr,  # (R,) int64 verify lengths, written here
    R,  # number of requests
    GAMMA,  # drafts per request
    M,  # SPS table length
    budget,  # K for MODE == 2 (negative means 0); unused otherwise
    MODE: tl.constexpr,  # 0 early stop, 1 retrospective argmax, 2 top-K budget
    USE_STS: tl.constexpr,  # calibrate the confidences with temperatures first
    USE_SHIFT: tl.constexpr,  # ... and subtract a logit offset per position after the temperature
    BLOCK_R: tl.constexpr,  # next power of two >= R
    BLOCK_G: tl.constexpr,  # next power of two >= γ
):
    # ---- 1-2. survivals of the whole batch as one (BLOCK_R, BLOCK_G) tile
    r = tl.arange(0, BLOCK_R)[:, None]  # (BLOCK_R, 1)
    j = tl.arange(0, BLOCK_G)[None, :]  # (1, BLOCK_G)
    valid = (r < R) & (j < GAMMA)  # (BLOCK_R, BLOCK_G)
    c = tl.load(conf_ptr + r * GAMMA + j, mask=valid, other=0.0)
    if USE_STS:
        # the reference clamps c to [1e-12, 1 - 1e-12]; 1 - 1e-12 is 1.0 in fp32, so clamp 1 - c instead
        c = tl.minimum(tl.maximum(c, 1e-12), 1.0)
        logit = tl.log(c) - tl.log(tl.maximum(1.0 - c, 1e-12))
        t = tl.load(temp_ptr + j, mask=j < GAMMA, other=1.0)  # (1, BLOCK_G)
        z = logit / t
        if USE_SHIFT:
            z = z - tl.load(temp_ptr + temp_stride + j, mask=j < GAMMA, other=0.0)  # (1, BLOCK_G)
        c = 1.0 / (1.0 + tl.exp(-z))
    c = tl.where(valid, c, 0.0)  # padding past γ only follows the real drafts, so it changes no product
    a = tl.cumprod(c, axis=1)  # (BLOCK_R, BLOCK_G) survivals, non-increasing in j

    # ---- 3. the greedy path as ONE descending sort of int64 keys: high 32 bits = the survival's
    # fp32 bits (a >= 0, so they order like the floats), low 32 bits = a tie-break that is larger
    # for smaller j, then smaller r. Every key is unique; padding gets -1 and sorts last.
    tie = (BLOCK_G - 1 - j) * BLOCK_R + (BLOCK_R - 1 - r)  # (BLOCK_R, BLOCK_G) in [0, BLOCK_R·BLOCK_G)
    bits = a.to(tl.int32, bitcast=True).to(tl.int64)
    key = tl.where(valid, (bits << 32) | tie.to(tl.int64), -1)  # (BLOCK_R, BLOCK_G)
    path = tl.sort(tl.reshape(key, (BLOCK_R * BLOCK_G,)), descending=True)  # (BLOCK_R·BLOCK_G,)
    gain = (path >> 32).to(tl.int32).to(tl.float32, bitcast=True)  # a of the n-th candidate

    # ---- 4. Θ after each step n = 1..N of the path, and Θ before it (n - 1)
    N = R * GAMMA
    pos = tl.arange(0, BLOCK_R * BLOCK_G)  # step n = pos + 1
    on_path = pos < N
    gain = tl.where(on_path, gain, 0.0)
    tau = R + tl.cumsum(gain, axis=0)  # τ_n
    theta_after = tau * _sps(sps_ptr, R + pos + 1, M, on_path)  # Θ_n
    theta_before = (tau - gain) * _sps(sps_ptr, R + pos, M, on_path)  # Θ_{n-1}
    theta_0 = R * _sps(sps_ptr, R, M, True)  # nothing admitted

    # ---- 5. how many candidates of the path to admit
    if MODE == 0:  # admit while Θ strictly improves: stop at the first step that does not
        n_admit = tl.min(tl.where(on_path & (theta_after <= theta_before), pos, N), axis=0)
    elif MODE == 1:  # the first global argmax of Θ_0..Θ_N (strictly above Θ_0, else nothing)
        masked = tl.where(on_path, theta_after, float("-inf"))
        best = tl.max(masked, axis=0)
        first = tl.min(tl.where(masked == best, pos, N), axis=0)  # the earliest step reaching the max
        n_admit = tl.where(best > theta_0, first + 1, 0)
    else:  # the top K, K clipped to [0, N]
        n_admit = tl.minimum(tl.maximum(budget, 0), N)

    # ---- 6. ℓ_r: admitted entries are exactly those whose key is >= the n_admit-th key of the path
    cut = tl.min(tl.where(pos < n_admit, path, 9223372036854775807), axis=0)  # int64 max if none
    admitted = valid & (key >= cut)  # (BLOCK_R, BLOCK_G), a prefix of every row
    lengths = tl.sum(admitted.to(tl.int32), axis=1)  # (BLOCK_R,)
    rows = tl.arange(0, BLOCK_R)
    tl.store(out_ptr + rows, lengths.to(tl.int64), mask=rows < R)


def fits(requests: int, gamma: int) -> bool:
    """Can the kernel schedule this batch in one tile?"""
    return triton.next_power_of_2(max(requests, 1)) * triton.next_power_of_2(max(gamma, 1)) <= MAX_TILE


def prefix_schedule_triton(
    confidences: torch.Tensor,
    temperatures: torch.Tensor | None,
    sps_table: torch.Tensor,
    early_stop: bool = True,
    budget: int | None = None,
) -> torch.Tensor:
    """(R, γ) fp32 confidences -> (R,) int64 verify lengths, as
    `prefix_schedule(prefix_survival(confidences, temperatures), profile, early_stop, budget)`
    with `sps_table = profile.table(device)`. `temperatures`: (γ',) fp32 STS temperatures, (2, γ')
    temperatures and logit offsets, or None; γ' >= γ."""
    if confidences.dim() != 2:
        raise ValueError(f"confidences must be (R, γ), got shape {tuple(confidences.shape)}")
    if sps_table.dim() != 1 or sps_table.numel() == 0:
        raise ValueError(f"sps_table must be a non-empty (M,) tensor, got shape {tuple(sps_table.shape)}")
    named = {"confidences": confidences, "sps_table": sps_table}
    if temperatures is not None:
        named["temperatures"] = temperatures
        shape_ok = temperatures.dim() == 1 or (temperatures.dim() == 2 and temperatures.shape[0] == 2)
        if not shape_ok or temperatures.shape[-1] < confidences.shape[1]:
            raise ValueError(
                f"temperatures must be (γ',) or (2, γ') with γ' >= γ = {confidences.shape[1]}, "
                f"got shape {tuple(temperatures.shape)}"
            )
    for name, t in named.items():
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != confidences.device:
            raise ValueError(f"{name} is on {t.device} but confidences are on {confidences.device}")
    R, gamma = confidences.shape
    lengths = torch.zeros(R, dtype=torch.long, device=confidences.device)
    if R == 0 or gamma == 0:
        return lengths
    if not fits(R, gamma):
        raise ValueError(
            f"R = {R}, γ = {gamma} exceed the one-tile kernel (next_pow2(R)·next_pow2(γ) <= {MAX_TILE}); "
            "use dspark.scheduler.prefix_schedule"
        )
    if budget is not None:
        mode = MODE_BUDGET
    else:
        mode = MODE_EARLY_STOP if early_stop else MODE_RETROSPECTIVE
    _prefix_schedule_kernel[(1,)](
        confidences,
        confidences if temperatures is None else temperatures,  # a dummy pointer when unused
        0 if temperatures is None else temperatures.shape[-1],
        sps_table,
        lengths,
        R,
        gamma,
        sps_table.numel(),
        0 if budget is None else int(budget),
        MODE=mode,
        USE_STS=temperatures is not None,
        USE_SHIFT=temperatures is not None and temperatures.dim() == 2,
        BLOCK_R=triton.next_power_of_2(R),
        BLOCK_G=triton.next_power_of_2(gamma),
    )
    return lengths
