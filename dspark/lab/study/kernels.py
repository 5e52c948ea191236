"""Each Triton kernel against its PyTorch reference on a CUDA GPU (`python -m dspark.bench kernels`).

For every hot path and a few batch sizes, at the shipped model's shapes
(V = 4096, dim 256, rank 64, 8 query / 2 kv heads of 32, γ = 7, 256 tokens
of context), it times the kernel and the reference on the same inputs
(CUDA events, median over --repeats after warm-up) and checks they agree
(same tokens / accepted counts / lengths, largest |Δ| of the floats).

The reference column is what dspark runs without the kernel: PyTorch ops on
the GPU for the samplers and the attention, and for the scheduler the host
round trip (copy the confidences to the CPU, Algorithm 1 in Python, copy the
lengths back) that the device kernel exists to avoid.

Without a CUDA GPU the command exits with a message. With `--interpret`
(`compare(..., cuda=False)`) it runs the same comparisons on the CPU under
Triton's interpreter at tiny sizes: a smoke test of the benchmark and of
agreement, whose timings say nothing about speed. `--compile-only`
(`compile_all`) needs no GPU either: it compiles every kernel at the shipped
shapes for a CUDA architecture (default sm_90, the H200) down to a cubin, which
catches what the interpreter tolerates and the GPU compiler does not.

What this file does not do: parse arguments, set TRITON_INTERPRET (it must be
set before Triton is imported, so the command does) or print.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import torch

GPU_SIZES = [1, 16, 64]  # requests per batch
INTERPRETER_SIZES = [1, 3]


def timed(fn: Callable[[], object], repeats: int, cuda: bool) -> float:
    """Median milliseconds per call after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def cases(R: int, gamma: int, small: bool, device: str):
    """(name, kernel_fn, reference_fn, agreement_fn) for each hot path at batch R."""
    from dspark.drafters.parallel import markov_block_reference
    from dspark.kv_cache import KVCache
    from dspark.lab.profiles import named_profile
    from dspark.model import RaggedIndex, ragged_attention_reference
    from dspark.sampling import SamplingParams
    from dspark.scheduler import prefix_schedule, prefix_survival
    from dspark.verify import verify_reference
    from dspark_kernels.markov_sampler import markov_block_sample_triton
    from dspark_kernels.prefix_scheduler import prefix_schedule_triton
    from dspark_kernels.ragged_attention import ragged_verify_attention
    from dspark_kernels.rejection_sampler import rejection_sample_triton

    V, D, r, H, Hkv, hd, ctx = (97, 16, 4, 4, 2, 8, 12) if small else (4096, 256, 64, 8, 2, 32, 256)
    g = torch.Generator().manual_seed(R)

    def rand(*shape):
        return torch.rand(*shape, generator=g).to(device)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    # Markov-head block sampler
    m_args = (randn(R, gamma, V) * 3, randn(R, gamma, D), torch.randint(V, (R,), generator=g).to(device),
              randn(V, r), randn(V, r) * 0.1, randn(D + r), randn(1))  # fmt: skip
    m_uniforms = rand(R, gamma)
    yield (
        "markov sampler",
        lambda: markov_block_sample_triton(*m_args, 1.0, m_uniforms),
        lambda: markov_block_reference(*m_args, SamplingParams(1.0), m_uniforms),
        lambda k, ref: (
            f"tokens {'equal' if torch.equal(k[0], ref[0]) else 'DIFFER'}, "
            f"max abs Δq {max_diff(k[1], ref[1]):.1e}"
        ),
    )

    # rejection sampler
    draft_probs = torch.softmax(randn(R, gamma, V) * 2, -1)
    target_probs = torch.softmax(randn(R, gamma + 1, V) * 2, -1)
    drafts = torch.multinomial(draft_probs.reshape(-1, V), 1).reshape(R, gamma)
    v_args = (drafts, draft_probs, target_probs, torch.arange(R, device=device) % (gamma + 1),
              rand(R, gamma), rand(R))  # fmt: skip
    yield (
        "rejection sampler",
        lambda: rejection_sample_triton(*v_args),
        lambda: verify_reference(*v_args),
        lambda k, ref: (
            "accepted + next token "
            + ("equal" if torch.equal(k[0], ref.accepted) and torch.equal(k[1], ref.next_token) else "DIFFER")
        ),
    )

    # ragged verify attention: R requests, ctx tokens cached each, a block of γ + 1 to verify
    cache = KVCache(1, R, Hkv, ctx + gamma + 1, hd, torch.float32, device)
    cache.keys[0].copy_(randn(*cache.keys[0].shape))
    cache.values[0].copy_(randn(*cache.values[0].shape))
    cache.lengths[:] = ctx
    slots = torch.arange(R, device=device)
    rb = RaggedIndex.build(
        slots, torch.full((R,), gamma + 1, device=device), cache.lengths[slots], cache.max_seq_len
    )
    q = randn(R * (gamma + 1), H, hd)
    a_args = (q, cache.keys[0], cache.values[0])
    yield (
        "ragged attention",
        lambda: ragged_verify_attention(*a_args, rb.slots, rb.starts, rb.cu_seqlens, rb.slot_index),
        lambda: ragged_attention_reference(*a_args, rb),
        lambda k, ref: f"max abs Δ {max_diff(k, ref):.1e}",
    )

    # prefix scheduler: the device kernel vs the host round trip
    profile = named_profile("h200")
    conf = rand(R, gamma)
    temps = 0.5 + rand(gamma)
    table = profile.table(device)
    yield (
        "prefix scheduler",
        lambda: prefix_schedule_triton(conf, temps, table),
        lambda: prefix_schedule(prefix_survival(conf.cpu(), temps.cpu()), profile).to(device),
        lambda k, ref: "lengths " + ("equal" if torch.equal(k.cpu(), ref.cpu()) else "DIFFER"),
    )


# ---- compile without a GPU ------------------------------------------------------------------------
POINTER_TYPES = {  # argument name -> pointee type; every other *_ptr is fp32
    "anchors_ptr": "i64", "tokens_ptr": "i64", "draft_tokens_ptr": "i64", "verify_lens_ptr": "i64",
    "accepted_ptr": "i64", "next_token_ptr": "i64", "out_ptr": "fp32", "slots_ptr": "i64",
    "starts_ptr": "i64", "cu_seqlens_ptr": "i64",
}  # fmt: skip
FLOAT_SCALARS = {"temperature", "sm_scale"}


def compile_variants() -> list[tuple[str, object, dict]]:
    """(label, kernel, constexprs) at the shipped model's shapes (V 4096, dim 256, r 64, hd 32, γ 7)."""
    from dspark_kernels.markov_sampler import markov_block_kernel
    from dspark_kernels.prefix_scheduler import _prefix_schedule_kernel
    from dspark_kernels.ragged_attention import _ragged_attention_kernel
    from dspark_kernels.rejection_sampler import rejection_kernel

    attention = dict(GROUP=4, HEAD_DIM=32, BLOCK_N=64, BLOCK_D=32)
    return [
        ("markov sampler, T > 0", markov_block_kernel, dict(GREEDY=False, BLOCK_V=4096, BLOCK_D=256, BLOCK_R=64)),
        ("markov sampler, greedy", markov_block_kernel, dict(GREEDY=True, BLOCK_V=4096, BLOCK_D=256, BLOCK_R=64)),
        ("rejection sampler", rejection_kernel, dict(BLOCK_V=4096)),
        ("ragged attention, tl.dot", _ragged_attention_kernel, dict(attention, BLOCK_M=16, USE_DOT=True)),
        ("ragged attention, no dot", _ragged_attention_kernel, dict(attention, BLOCK_M=8, USE_DOT=False)),
        *[
            (f"prefix scheduler, mode {mode}, 64x8", _prefix_schedule_kernel,
             dict(MODE=mode, USE_STS=True, BLOCK_R=64, BLOCK_G=8))
            for mode in (0, 1, 2)
        ],
        ("prefix scheduler, 512x8", _prefix_schedule_kernel, dict(MODE=0, USE_STS=True, BLOCK_R=512, BLOCK_G=8)),
    ]  # fmt: skip


def compile_all(arch: int) -> list[dict]:
    """Compile every variant for CUDA compute capability `arch`; one row per variant."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    rows = []
    for label, kernel, constexprs in compile_variants():
        signature = {}
        for param in kernel.params:
            name = param.name
            if param.is_constexpr:
                signature[name] = "constexpr"
            elif name.endswith("_ptr"):
                signature[name] = "*" + POINTER_TYPES.get(name, "fp32")
            else:
                signature[name] = "fp32" if name in FLOAT_SCALARS else "i32"
        start = time.perf_counter()
        try:
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                target=GPUTarget("cuda", arch, 32),
            )
            result = (
                f"ok: {len(compiled.asm['cubin']) / 1024:.0f} KiB cubin, {compiled.metadata.shared} B shared"
            )
        except Exception as exc:  # report every kernel, then fail
            result = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(dict(kernel=label, seconds=time.perf_counter() - start, result=result))
    return rows


@torch.no_grad()
def compare(sizes: list[int], gamma: int, repeats: int, cuda: bool) -> Iterator[dict]:
    """One row per hot path and batch size, yielded as it is measured: kernel and reference timed on
    the same inputs, and their agreement. Without `cuda`: tiny shapes on the CPU (the interpreter)."""
    device = "cuda" if cuda else "cpu"
    for R in sizes:
        for name, kernel_fn, reference_fn, agree in cases(R, gamma, not cuda, device):
            agreement = agree(kernel_fn(), reference_fn())
            ref_ms, kernel_ms = timed(reference_fn, repeats, cuda), timed(kernel_fn, repeats, cuda)
            yield dict(kernel=name, requests=R, reference_ms=ref_ms, kernel_ms=kernel_ms,
                       speedup=ref_ms / kernel_ms, agreement=agreement)  # fmt: skip
