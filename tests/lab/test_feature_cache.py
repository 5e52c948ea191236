"""Drafter training data: the anchor sampler, the feature cache (== a live target pass; stale caches
refused or rebuilt) and the equal-budget step count."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from helpers import TINY

from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab.training.anchors import anchor_counts, candidate_counts, every_anchor, sample_anchors
from dspark.lab.training.drafters import DrafterTrainConfig, batch_loss, planned_steps
from dspark.lab.training.feature_cache import (
    FeatureCache,
    LiveFeatures,
    StaleFeatureCache,
    build_feature_cache,
    ensure_feature_cache,
    live_features,
    response_caches,
)
from dspark.model import ModelConfig, Transformer
from dspark.training import supervised_target_probs


def records(n: int = 10, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt = torch.randint(
            0, TINY.vocab_size, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g
        )
        response = torch.randint(
            0, TINY.vocab_size, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g
        )
        out.append({"domain": "code", "split": "train", "prompt_ids": prompt.tolist(),
                    "response_ids": response.tolist()})  # fmt: skip
    out.append(
        {"domain": "code", "split": "train", "prompt_ids": [1] * 50, "response_ids": [2] * 40}
    )  # cut at 64
    return out


# ---- the anchor sampler -----------------------------------------------------------------------


@pytest.mark.parametrize("density", [0, 1, 3, 16, 100])
def test_anchors_are_distinct_response_positions(density):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([30, 12, 9, 9, 40, 5])
    prompt_lens = torch.tensor([10, 11, 9, 3, 2, 2])  # row 1: one response token, row 2: none
    for _ in range(20):
        anchors, valid = sample_anchors(lengths, prompt_lens, density, g)
        for b in range(len(lengths)):
            picked = anchors[b][valid[b]].tolist()
            assert len(picked) == len(set(picked))  # no repeats
            assert all(prompt_lens[b] <= a <= lengths[b] - 2 for a in picked)  # never a prompt position
            want = candidate_counts(lengths, prompt_lens)[b]
            assert len(picked) == (want if density == 0 else min(density, want))
        assert torch.equal(valid.sum(1), anchor_counts(lengths, prompt_lens, density))


def test_every_anchor_is_density_zero_without_randomness():
    lengths, prompt_lens = torch.tensor([30, 12, 9, 40]), torch.tensor([10, 11, 9, 2])
    anchors, valid = every_anchor(lengths, prompt_lens)
    sampled, sampled_valid = sample_anchors(lengths, prompt_lens, 0, torch.Generator().manual_seed(1))
    assert torch.equal(valid, sampled_valid) and torch.equal(anchors[valid], sampled[sampled_valid])


def test_a_short_response_is_covered_completely():
    lengths, prompt_lens = torch.tensor([17]), torch.tensor([10])  # response tokens 10..16
    for density in (0, 6, 64):
        anchors, valid = sample_anchors(lengths, prompt_lens, density, torch.Generator().manual_seed(3))
        assert anchors[0][valid[0]].tolist() == list(range(10, 16))  # every anchor with a next token


def test_anchor_density_is_checked():
    with pytest.raises(ValueError, match="density"):
        sample_anchors(torch.tensor([9]), torch.tensor([2]), -1, torch.Generator())


# ---- the feature cache ------------------------------------------------------------------------


def test_cache_holds_exactly_the_live_features(tmp_path, tiny_model):
    data = records()
    cache = build_feature_cache(tiny_model, data, tmp_path / "f", dtype="float32")
    idx = [3, 0, 10, 7]
    live, cached = live_features(tiny_model, [data[i] for i in idx]), cache.batch(idx)
    for name in ("tokens", "lengths", "prompt_lens"):
        assert torch.equal(getattr(live, name), getattr(cached, name)), name
    for b, n in enumerate(live.lengths.tolist()):  # padding rows differ (the target sees padding tokens)
        torch.testing.assert_close(cached.taps[b, :n], live.taps[b, :n], rtol=0, atol=1e-5)
        torch.testing.assert_close(cached.last_hidden[b, :n], live.last_hidden[b, :n], rtol=0, atol=1e-5)
        torch.testing.assert_close(cached.lse[b, :n], live.lse[b, :n], rtol=0, atol=1e-5)
    assert live.lengths.max() == TINY.max_seq_len  # the long record is cut at the context


def test_fp16_cache_is_close(tmp_path, tiny_model):
    data = records()
    cache = build_feature_cache(tiny_model, data, tmp_path / "f")
    assert cache.taps.dtype.name == "float16" and cache.manifest["dtype"] == "float16"
    live, cached = live_features(tiny_model, data[:4]), cache.batch([0, 1, 2, 3])
    n = int(live.lengths[0])
    torch.testing.assert_close(cached.taps[0, :n], live.taps[0, :n], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("kind", ["mtp", "eagle", "dflash", "dspark", "dspark-rnn"])
def test_training_from_the_cache_gives_the_live_loss(tmp_path, tiny_model, kind):
    data = records()
    cache = build_feature_cache(tiny_model, data, tmp_path / "f", dtype="float32")
    torch.manual_seed(0)
    if kind in ("mtp", "eagle"):
        config = AutoregressiveDrafterConfig(kind, 1 if kind == "mtp" else 3, ffn_hidden=64)
        drafter = AutoregressiveDrafter(tiny_model, config)
    else:
        drafter = ParallelDrafter(
            tiny_model, ParallelDrafterConfig(kind, gamma=4, ffn_hidden=64, rank=8, mask_id=5)
        )
    tc = DrafterTrainConfig(unroll=3, anchors_per_seq=5)
    idx = [1, 4, 10, 6]
    losses = []
    for batch in (cache.batch(idx), LiveFeatures(tiny_model, data).batch(idx)):
        loss, acc, anchors, pairs = batch_loss(
            drafter, tiny_model, batch, tc, torch.Generator().manual_seed(7)
        )
        losses.append((loss.item(), [float(a) for a in acc], anchors, pairs))
    assert losses[0][2] == losses[1][2] > 0 and losses[0][3] == losses[1][3] >= losses[0][2]
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-5)
    assert losses[0][1] == pytest.approx(losses[1][1], rel=1e-5, nan_ok=True)


def test_target_distribution_only_at_supervised_positions(tiny_model):
    batch = live_features(tiny_model, records()[:3])
    probs, row_of = supervised_target_probs(tiny_model, batch)
    full = torch.softmax(tiny_model(batch.tokens).logits.float(), -1)
    n_rows = int(sum((batch.lengths - 1 - batch.prompt_lens).clamp(min=0)))
    assert probs.shape[0] == n_rows + 1 and probs[-1].abs().sum() == 0  # + the all-zero row
    for b in range(3):
        for j in range(batch.tokens.shape[1]):
            supervised = batch.prompt_lens[b] <= j < batch.lengths[b] - 1
            assert (row_of[b, j] < n_rows) == supervised
            if supervised:
                torch.testing.assert_close(probs[row_of[b, j]], full[b, j], rtol=0, atol=1e-6)


def test_a_stale_cache_is_refused_and_rebuilt(tmp_path, tiny_model):
    data = records()
    build_feature_cache(tiny_model, data, tmp_path / "f")
    FeatureCache.open(tmp_path / "f", tiny_model, data)  # fresh: opens
    torch.manual_seed(5)
    other = Transformer(TINY).eval()  # another target, same shapes
    with pytest.raises(StaleFeatureCache, match="target weights"):
        FeatureCache.open(tmp_path / "f", other, data)
    retapped = Transformer(ModelConfig(**{**TINY.to_dict(), "tap_layers": (1, 2)})).eval()
    retapped.load_state_dict(tiny_model.state_dict())
    with pytest.raises(StaleFeatureCache, match="tap layers"):
        FeatureCache.open(tmp_path / "f", retapped, data)
    with pytest.raises(StaleFeatureCache, match="token sequences"):
        FeatureCache.open(tmp_path / "f", tiny_model, data[:-2] + data[-1:] + data[-2:-1])
    messages = []
    cache = ensure_feature_cache(retapped, data, tmp_path / "f", log=messages.append)
    assert "tap layers" in messages[0] and cache.manifest["tap_layers"] == [1, 2]
    assert cache.taps.shape[1:] == (2, TINY.dim)
    assert ensure_feature_cache(retapped, data, tmp_path / "f", log=messages.append) is not None
    assert len(messages) == 1  # fresh now: opened, not rebuilt
    assert not (tmp_path / "f.partial").exists()


def test_a_gzipped_responses_file_shares_its_plain_twins_cache(tmp_path, tiny_model):
    """The committed answers are `responses.jsonl.gz`; the generated ones `responses.jsonl`: the same records
    must open the same cache (building it takes ~20 minutes on SmolLM2), not a second one."""
    domains = ("code", "math", "chat")
    text = "".join(json.dumps({**r, "split": split, "domain": domains[i % 3]}) + "\n"
                   for split in ("train", "val") for i, r in enumerate(records(5)))  # fmt: skip
    plain, packed = tmp_path / "responses.jsonl", tmp_path / "responses.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    built, reopened = [], []
    response_caches(tiny_model, plain, tmp_path / "features", log=built.append)
    response_caches(tiny_model, packed, tmp_path / "features", log=reopened.append)
    assert any("building" in m for m in built) and not any("building" in m for m in reopened)
    assert sorted(p.name for p in (tmp_path / "features").iterdir()) == ["responses"]


def test_an_interrupted_build_leaves_the_old_cache(tmp_path, tiny_model, monkeypatch):
    data = records()
    build_feature_cache(tiny_model, data, tmp_path / "f")
    before = json.loads((tmp_path / "f" / "manifest.json").read_text())

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Transformer, "forward", fail)
    with pytest.raises(KeyboardInterrupt):
        build_feature_cache(tiny_model, data[:5], tmp_path / "f")
    assert json.loads((tmp_path / "f" / "manifest.json").read_text()) == before
    FeatureCache.open(tmp_path / "f", tiny_model, data)


# ---- the budget -------------------------------------------------------------------------------


def test_equal_epochs_give_every_drafter_the_same_anchors(tiny_model):
    source = LiveFeatures(tiny_model, records())
    lengths, prompt_lens = source.lengths()
    total = int(candidate_counts(lengths, prompt_lens).sum())
    eagle = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=64))
    dspark = ParallelDrafter(
        tiny_model, ParallelDrafterConfig("dspark", gamma=4, ffn_hidden=64, rank=8, mask_id=5)
    )
    for density in (0, 2, 5):
        tc = DrafterTrainConfig(epochs=3.0, batch_size=2, anchors_per_seq=density)
        per_pass = int(anchor_counts(lengths, prompt_lens, density).sum())
        steps = planned_steps(dspark, source, tc)
        anchors = steps * tc.batch_size / len(source) * per_pass  # expected anchors seen
        assert anchors == pytest.approx(3.0 * total, rel=0.15)
    assert (
        planned_steps(eagle, source, DrafterTrainConfig(epochs=3.0, batch_size=2)) == 17
    )  # ceil(3 * 11 / 2)


def test_length_bucketed_batches_cover_every_sequence_once_per_pass():
    from dspark.lab.training.drafters import length_bucketed_batches

    lengths = torch.randint(1, 200, (103,), generator=torch.Generator().manual_seed(0))
    stream = length_bucketed_batches(lengths, 4, torch.Generator().manual_seed(1), pool=5)
    one_pass = [next(stream) for _ in range(26)]  # ceil(103 / 4) batches, the last pool's tail short
    assert sorted(i for b in one_pass for i in b) == list(range(103))
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in one_pass) / len(one_pass)
    assert spread < 40  # sorted pools: far narrower than random batches of 4 (~100 apart)
    assert sorted(i for b in (next(stream) for _ in range(26)) for i in b) == list(range(103))


# ---- the commands ------------------------------------------------------------------------------


def test_train_features_and_drafter_commands(small_checkpoint, tmp_path, capsys):
    """`train features` builds the caches once; `train drafter` reuses them, records its taps and budget;
    --taps gets its own cache; a drafter trained on other taps is refused by this target."""
    from dspark import train
    from dspark.checkpoint import CheckpointError, load_target
    from dspark.drafters import load_drafter
    from dspark.lab.cli import UsageError

    g = torch.Generator().manual_seed(0)
    with open(tmp_path / "r.jsonl", "w") as f:
        for i in range(14):
            split, domain = ("val" if i < 3 else "train"), ("code", "math", "chat")[i % 3]
            prompt = torch.randint(10, 500, (5,), generator=g).tolist()
            response = torch.randint(10, 500, (8 + i,), generator=g).tolist()
            f.write(
                json.dumps({"domain": domain, "split": split, "prompt_ids": prompt, "response_ids": response})
                + "\n"
            )
    common = ["--responses", str(tmp_path / "r.jsonl"), "--features-dir", str(tmp_path / "f"),
              "--checkpoint", str(small_checkpoint)]  # fmt: skip
    train.main(["features", *common])
    assert capsys.readouterr().out.count("building it") == 2  # train and val
    out = tmp_path / "d.safetensors"
    train.main(["drafter", "--kind", "dspark", *common, "--epochs", "2", "--gamma", "3", "--layers", "1",
                "--rank", "4", "--width", "24", "--out", str(out), "--batch-size", "4",
                "--keep-at", "1"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "building it" not in printed and " epochs, " in printed  # the cache was reused
    config = json.loads(out.with_suffix(".json").read_text())["config"]
    assert (config["rank"], config["ffn_hidden"]) == (4, 24)
    assert config["qk_norm"] is True  # a parallel kind gets the reference's q/k RMSNorm unless --no-qk-norm
    meta = json.loads(out.with_suffix(".json").read_text())["meta"]
    assert (
        meta["tap_layers"] == [0]
        and meta["epochs"] == pytest.approx(2.0, rel=0.2)
        and meta["features"] == "cache"
    )
    assert json.loads((tmp_path / "d.epochs-1.json").read_text())["meta"]["epochs"] >= 1  # --keep-at's copy
    target, _ = load_target(small_checkpoint)
    assert load_drafter(out, target).head.weights()[0].shape[1] == 4  # loads for the taps it was trained on
    with pytest.raises(UsageError, match="--keep-at takes epochs inside the run"):
        train.main(["drafter", "--kind", "mtp", *common, "--epochs", "2", "--keep-at", "0.5", "2"])
    train.main(["drafter", "--kind", "mtp", *common, "--taps", "1", "--out", str(tmp_path / "m.safetensors")])
    assert capsys.readouterr().out.count("building it") == 2  # a new cache for taps [1]
    assert "qk_norm" not in json.loads((tmp_path / "m.json").read_text())["config"]  # not a parallel kind
    assert (tmp_path / "f" / "r" / "taps-1" / "train" / "manifest.json").is_file()
    with pytest.raises(CheckpointError, match=r"trained on target layers \[1\]"):
        load_drafter(tmp_path / "m.safetensors", target)
