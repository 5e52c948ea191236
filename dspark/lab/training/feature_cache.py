"""The target's features, computed once: a memory-mapped store drafter training reads.

Drafters learn from a FROZEN target, so its features of a training sequence
never change between steps or epochs. Recomputing them (a full target pass and
a full-vocabulary softmax at every position) was ~60% of a drafter step. Here
one pass of the target over the regenerated responses writes, per token,

  * the residual stream after each tap layer   taps.npy    (N, n_taps, dim)
  * the final-normed hidden state              hidden.npy  (N, dim)
  * the log-sum-exp of the target's logits      lse.npy     (N,) fp32

in fp16 (or fp32, for tests), plus the tokens and an index (offset, length,
prompt length) per sequence, under DSPARK_HOME. A manifest records what the
features depend on: a fingerprint of the target's weights and config, its tap
layers, a fingerprint of the sequences, the dtype and the format version. A
cache that disagrees with the target or the data it is opened for is stale:
`ensure_feature_cache` rebuilds it (and says why); `FeatureCache.open` refuses.
A build writes into a temporary directory renamed into place at the end, so an
interrupted build never leaves a half-written cache behind.

The target's distribution p_t is not stored (V floats per token): training
computes it only where a drafter is supervised, from the cached final hidden
state through the frozen LM head (`supervised_target_probs`) -- the same
numbers the live target pass gives there. A drafter with a draft vocabulary
needs p_t only at its K ids: with the cached log-sum-exp that is K head rows
instead of all V and no softmax (SmolLM2: 8k of 49k ids; the full head and
softmax were over half of a training step).

What this file does not do: choose anchors (anchors.py) or compute losses.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dspark.device import model_device
from dspark.lab import storage
from dspark.model import Transformer
from dspark.training import FeatureBatch

CACHE_VERSION = 2  # 2: lse.npy
DTYPES = {"float16": (np.float16, torch.float16), "float32": (np.float32, torch.float32)}


class StaleFeatureCache(RuntimeError):
    """The cache on disk was made for another target, other taps, other data or another format."""


def sequence_of(record: dict, max_len: int) -> tuple[list[int], int]:
    """(prompt + response tokens cut at max_len, the prompt's length within them)."""
    seq = (record["prompt_ids"] + record["response_ids"])[:max_len]
    return seq, min(len(record["prompt_ids"]), len(seq))


def pad_sequences(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded token ids and (B,) lengths."""
    T = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), T, dtype=torch.long, device="cpu")
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s, device="cpu")
    return tokens, torch.tensor([len(s) for s in seqs], device="cpu")


@torch.no_grad()
def features_of_tokens(
    target: Transformer, tokens: torch.Tensor, lengths: torch.Tensor, prompt_lens: torch.Tensor
) -> FeatureBatch:
    """A live target pass (fp32) over right-padded tokens (B, T) with (B,) lengths and prompt lengths."""
    tokens = tokens.to(model_device(target))
    out = target(tokens, return_taps=True)
    lse = logsumexp_rows(out.logits)
    return FeatureBatch(
        tokens, lengths.cpu(), prompt_lens.cpu(), out.taps.float(), out.last_hidden.float(), lse
    )


def logsumexp_rows(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """log Σ_v exp(logits[..., v]) in fp32, `chunk` rows at a time (no fp32 copy of all the logits)."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.cat(
        [torch.logsumexp(flat[i : i + chunk].float(), dim=-1) for i in range(0, flat.shape[0], chunk)]
    )
    return out.view(logits.shape[:-1])


def live_features(target: Transformer, records: list[dict]) -> FeatureBatch:
    """The features of `records` from a live target pass (fp32): what the cache stores."""
    seqs, prompt_lens = zip(*(sequence_of(r, target.config.max_seq_len) for r in records))
    tokens, lengths = pad_sequences(list(seqs))
    return features_of_tokens(target, tokens, lengths, torch.tensor(prompt_lens, device="cpu"))


def weights_fingerprint(*modules: torch.nn.Module) -> str:
    """SHA-256 of each module's config and weights in turn (fp32 bytes, in state-dict order); every module
    has a `config` with `to_dict()` (the target, the drafters)."""
    h = hashlib.sha256()
    for module in modules:
        h.update(json.dumps(module.config.to_dict(), sort_keys=True).encode())
        for name, tensor in module.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def target_fingerprint(target: Transformer) -> str:
    """SHA-256 of the target's config and weights (`weights_fingerprint` of the target alone)."""
    return weights_fingerprint(target)


def records_fingerprint(records: list[dict], max_len: int) -> str:
    """SHA-256 of the token sequences exactly as the cache stores them."""
    h = hashlib.sha256(str(max_len).encode())
    for r in records:
        seq, prompt_len = sequence_of(r, max_len)
        h.update(json.dumps([prompt_len, seq]).encode())
    return h.hexdigest()


def expected_manifest(target: Transformer, records: list[dict], dtype: str) -> dict:
    return {"version": CACHE_VERSION, "target": target_fingerprint(target),
            "tap_layers": list(target.config.tap_layers), "dim": target.config.dim,
            "sequences": len(records), "data": records_fingerprint(records, target.config.max_seq_len),
            "dtype": dtype}  # fmt: skip


class FeatureCache:
    """An opened cache: `len(cache)` sequences, `cache.batch(indices)` -> FeatureBatch."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        manifest = self.directory / "manifest.json"
        if not manifest.is_file():
            raise StaleFeatureCache(f"no feature cache in {self.directory}")
        self.manifest = json.loads(manifest.read_text())
        self.index = np.load(self.directory / "index.npy")  # (n, 3): offset, length, prompt length
        self.tokens = np.load(self.directory / "tokens.npy", mmap_mode="r")  # (N,)
        self.taps = np.load(self.directory / "taps.npy", mmap_mode="r")  # (N, n_taps, dim)
        self.hidden = np.load(self.directory / "hidden.npy", mmap_mode="r")  # (N, dim)
        self.lse = np.load(self.directory / "lse.npy", mmap_mode="r")  # (N,) fp32

    @classmethod
    def open(cls, directory: str | Path, target: Transformer, records: list[dict]) -> FeatureCache:
        """Open the cache in `directory`, refusing it unless it holds exactly these features."""
        cache = cls(directory)
        reasons = cache.stale_reasons(expected_manifest(target, records, cache.manifest.get("dtype")))
        if reasons:
            raise StaleFeatureCache(f"feature cache {directory} is stale: {'; '.join(reasons)}")
        return cache

    def stale_reasons(self, expected: dict) -> list[str]:
        names = {"version": "format version", "target": "target weights", "tap_layers": "tap layers",
                 "dim": "width", "sequences": "number of sequences", "data": "token sequences"}  # fmt: skip
        return [f"{label} differ ({self.manifest.get(key)!r} cached, {expected[key]!r} now)"
                if key in ("tap_layers", "sequences", "version", "dim") else f"{label} differ"
                for key, label in names.items() if self.manifest.get(key) != expected[key]]  # fmt: skip

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(n,) sequence lengths and (n,) prompt lengths of every cached sequence."""
        return torch.from_numpy(self.index[:, 1].copy()), torch.from_numpy(self.index[:, 2].copy())

    def batch(self, indices: list[int]) -> FeatureBatch:
        rows = self.index[indices]
        B, T = len(rows), int(rows[:, 1].max())
        n_taps, dim = self.taps.shape[1:]
        tokens = torch.zeros(B, T, dtype=torch.long, device="cpu")  # read on the host, moved by the trainer
        taps = torch.zeros(B, T, n_taps, dim, device="cpu")
        hidden = torch.zeros(B, T, dim, device="cpu")
        lse = torch.zeros(B, T, device="cpu")
        for b, (offset, length, _) in enumerate(rows.tolist()):
            span = slice(offset, offset + length)
            tokens[b, :length] = torch.from_numpy(self.tokens[span].astype(np.int64))
            taps[b, :length] = torch.from_numpy(np.array(self.taps[span], dtype=np.float32))
            hidden[b, :length] = torch.from_numpy(np.array(self.hidden[span], dtype=np.float32))
            lse[b, :length] = torch.from_numpy(np.array(self.lse[span], dtype=np.float32))
        lengths, prompt_lens = torch.from_numpy(rows[:, 1].copy()), torch.from_numpy(rows[:, 2].copy())
        return FeatureBatch(tokens, lengths, prompt_lens, taps, hidden, lse)


class LiveFeatures:
    """The FeatureCache interface over a live target pass (fp32): for tests, notebooks and small runs."""

    def __init__(self, target: Transformer, records: list[dict]) -> None:
        self.target, self.records = target, records

    def __len__(self) -> int:
        return len(self.records)

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = [sequence_of(r, self.target.config.max_seq_len) for r in self.records]
        return torch.tensor([len(s) for s, _ in seqs], device="cpu"), torch.tensor(
            [p for _, p in seqs], device="cpu"
        )

    def batch(self, indices: list[int]) -> FeatureBatch:
        return live_features(self.target, [self.records[i] for i in indices])


@torch.no_grad()
def build_feature_cache(
    target: Transformer,
    records: list[dict],
    directory: str | Path,
    dtype: str = "float16",
    tokens_per_pass: int = 8192,
) -> FeatureCache:
    """One target pass over `records` (longest first, ~tokens_per_pass tokens per pass) into `directory`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    np_dtype, _ = DTYPES[dtype]
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    max_len, cfg, device = target.config.max_seq_len, target.config, model_device(target)
    seqs = [sequence_of(r, max_len) for r in records]
    lengths = np.array([len(s) for s, _ in seqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    index = np.stack([offsets, lengths, np.array([p for _, p in seqs], dtype=np.int64)], axis=1)
    N = int(lengths.sum())
    store = np.lib.format.open_memmap
    tokens = store(tmp / "tokens.npy", mode="w+", dtype=np.int32, shape=(N,))
    taps = store(tmp / "taps.npy", mode="w+", dtype=np_dtype, shape=(N, len(cfg.tap_layers), cfg.dim))
    hidden = store(tmp / "hidden.npy", mode="w+", dtype=np_dtype, shape=(N, cfg.dim))
    lse = store(tmp / "lse.npy", mode="w+", dtype=np.float32, shape=(N,))
    order = np.argsort(-lengths, kind="stable")
    bar = tqdm(total=N, desc="feature cache", unit="tok", unit_scale=True)
    start = 0
    while start < len(order):
        rows = max(1, tokens_per_pass // int(lengths[order[start]]))
        chunk = order[start : start + rows].tolist()
        batch_tokens, batch_lengths = pad_sequences([seqs[i][0] for i in chunk])
        out = target(batch_tokens.to(device), return_taps=True)  # on the target's device, stored on the host
        stored_taps, stored_hidden = (
            out.taps.float().cpu().numpy().astype(np_dtype),
            out.last_hidden.float().cpu().numpy().astype(np_dtype),
        )
        stored_lse = logsumexp_rows(out.logits).cpu().numpy()
        if not (np.isfinite(stored_taps).all() and np.isfinite(stored_hidden).all()):
            raise ValueError(f"target features overflow {dtype}; build the cache with dtype='float32'")
        for b, i in enumerate(chunk):
            span, n = slice(int(offsets[i]), int(offsets[i] + lengths[i])), int(batch_lengths[b])
            tokens[span] = batch_tokens[b, :n].numpy()
            taps[span] = stored_taps[b, :n]
            hidden[span] = stored_hidden[b, :n]
            lse[span] = stored_lse[b, :n]
        bar.update(int(batch_lengths.sum()))
        start += rows
    bar.close()
    for array in (tokens, taps, hidden, lse):
        array.flush()
    np.save(tmp / "index.npy", index)
    storage.write_text_atomic(
        tmp / "manifest.json", json.dumps(expected_manifest(target, records, dtype), indent=2)
    )
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return FeatureCache(directory)


def ensure_feature_cache(
    target: Transformer, records: list[dict], directory: str | Path, dtype: str = "float16", log=print
) -> FeatureCache:
    """The cache in `directory` if it holds exactly these features, else a freshly built one."""
    try:
        return FeatureCache.open(directory, target, records)
    except StaleFeatureCache as exc:
        log(f"{exc}; building it")
        return build_feature_cache(target, records, directory, dtype)


def response_caches(
    target: Transformer, responses_path: str | Path, root: str | Path, log=print
) -> tuple[FeatureCache, FeatureCache]:
    """(train, val) caches of the responses file, under root/<file stem, without .gz>/taps-<layers>/<split> (one per tap
    set, so comparing taps never rebuilds), built or rebuilt as needed."""
    from dspark.lab.training.responses import load_responses

    caches = []
    taps = "-".join(map(str, target.config.tap_layers))
    name = Path(responses_path).name.removesuffix(".gz")  # a gzipped file shares its plain twin's cache
    for split in ("train", "val"):
        records = load_responses(Path(responses_path), split)
        directory = Path(root) / Path(name).stem / f"taps-{taps}" / split
        t0 = time.perf_counter()
        caches.append(ensure_feature_cache(target, records, directory, log=log))
        log(f"feature cache {directory}: {len(records)} sequences, {int(caches[-1].index[:, 1].sum()):,} tokens, "
            f"taps {list(target.config.tap_layers)} ({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    return caches[0], caches[1]
