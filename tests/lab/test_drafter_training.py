"""Drafter training (dspark/lab/training/drafters.py): it improves acceptance and round-trips, an interrupted run
resumes exactly, snapshots change nothing. (The unrolled forward = inference: tests/core/test_autoregressive.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dspark.drafters import load_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.lab.training.drafters import DrafterTrainConfig, load_history, train_drafter
from dspark.lab.training.feature_cache import LiveFeatures


def test_training_improves_acceptance_and_round_trips(tmp_path, tiny_model):
    torch.manual_seed(1)
    # a target-like data set: greedy continuations of the tiny model itself are very regular
    records = []
    for s in range(24):
        prompt = torch.randint(0, 97, (4,), generator=torch.Generator().manual_seed(s)).tolist()
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(20):
                seq.append(int(tiny_model(torch.tensor([seq])).logits[0, -1].argmax()))
        records.append({"domain": "code", "split": "train", "prompt_ids": prompt, "response_ids": seq[4:]})
    drafter = AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=64))
    tc = DrafterTrainConfig(steps=40, batch_size=6, unroll=3, lr=3e-3, eval_every=20, eval_sequences=12)
    train, val = LiveFeatures(tiny_model, records), LiveFeatures(tiny_model, records[:12])
    meta = train_drafter(drafter, tiny_model, train, val, tc, tmp_path / "d.safetensors", {})
    first, last = (
        meta["history"][0]["val_expected_acceptance"],
        meta["history"][-1]["val_expected_acceptance"],
    )
    assert len(last) == 3 and last[0] > 0.3 and last[0] >= first[0] - 0.05
    loaded = load_drafter(tmp_path / "d.safetensors", tiny_model)
    assert loaded.config == drafter.config
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a.half().float(), b, msg=name)


def live_sets(target, n: int, shortest: int, n_val: int, seed: int) -> tuple[LiveFeatures, LiveFeatures]:
    """n random code records (4 prompt tokens, responses of shortest, shortest + 1, ... tokens) as live training
    features, and the first n_val of them as the validation set."""
    g = torch.Generator().manual_seed(seed)
    records = [{"domain": "code", "split": "train", "prompt_ids": torch.randint(0, 97, (4,), generator=g).tolist(),
                "response_ids": torch.randint(0, 97, (shortest + i,), generator=g).tolist()} for i in range(n)]  # fmt: skip
    return LiveFeatures(target, records), LiveFeatures(target, records[:n_val])


class StopsAt:
    """A feature source that raises KeyboardInterrupt when asked for its `n`-th batch (an interrupted run)."""

    def __init__(self, source, n: int):
        self.source, self.n, self.calls = source, n, 0

    def __len__(self) -> int:
        return len(self.source)

    def lengths(self):
        return self.source.lengths()

    def batch(self, indices):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.source.batch(indices)


@pytest.mark.parametrize("kind, anchors", [("eagle", 2), ("dspark", 2), ("dspark", 0)])  # 0: every anchor
def test_an_interrupted_run_resumes_exactly(tmp_path, tiny_model, kind, anchors):
    """Stopped during step 5 (after the validation at step 4), a resumed run ends with the same weights,
    history and validation as the run that never stopped: same batches, same anchors, same optimizer."""
    from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
    from dspark.lab.training.drafters import trainer_state_path

    train, val = live_sets(tiny_model, n=12, shortest=6, n_val=4, seed=0)

    def fresh():
        torch.manual_seed(0)
        if kind == "eagle":
            return AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 3, ffn_hidden=64))
        return ParallelDrafter(
            tiny_model, ParallelDrafterConfig(kind, gamma=3, ffn_hidden=64, rank=4, mask_id=5)
        )

    tc = DrafterTrainConfig(
        steps=7, batch_size=3, unroll=3, anchors_per_seq=anchors, eval_every=2, bf16=False
    )
    whole = train_drafter(fresh(), tiny_model, train, val, tc, tmp_path / "whole.safetensors", {})
    assert not trainer_state_path(tmp_path / "whole.safetensors").exists()  # a finished run leaves no state

    out = tmp_path / "cut.safetensors"
    with pytest.raises(KeyboardInterrupt):
        train_drafter(fresh(), tiny_model, StopsAt(train, 5), val, tc, out, {})
    assert trainer_state_path(out).is_file()
    with pytest.raises(ValueError, match="differs in: lr"):  # other settings: refused, state kept
        train_drafter(fresh(), tiny_model, train, val, replace(tc, lr=0.5), out, {}, resume=True)
    resumed = train_drafter(fresh(), tiny_model, train, val, tc, out, {}, resume=True)
    assert resumed["history"] == whole["history"] and len(whole["history"]) == 4
    a, b = (load_drafter(p, tiny_model).state_dict() for p in (tmp_path / "whole.safetensors", out))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="nothing to resume"):
        train_drafter(fresh(), tiny_model, train, val, tc, out, {}, resume=True)


def test_snapshots_keep_the_run_and_its_resumption_unchanged(tmp_path, tiny_model):
    """keep_at: a validated copy at the first step reaching each epoch mark; the run itself (final weights and
    its regular validations) is the one without snapshots, and an interrupted run with snapshots resumes to the
    same files."""
    from dspark.lab.training.drafters import snapshot_path

    train, val = live_sets(tiny_model, n=9, shortest=5, n_val=3, seed=1)

    def fresh():
        torch.manual_seed(0)
        return AutoregressiveDrafter(tiny_model, AutoregressiveDrafterConfig("eagle", 2, ffn_hidden=64))

    tc = DrafterTrainConfig(epochs=3, batch_size=3, unroll=2, eval_every=4, bf16=False)  # 9 steps
    plain = train_drafter(fresh(), tiny_model, train, val, tc, tmp_path / "plain.safetensors", {})
    kept = train_drafter(
        fresh(), tiny_model, train, val, tc, tmp_path / "kept.safetensors", {}, keep_at=(0.5, 2)
    )
    regular = [h for h in kept["history"] if h["step"] % 4 == 0 or h["step"] == 9]
    assert regular == plain["history"] and [h["step"] for h in kept["history"]] == [2, 4, 6, 8, 9]  # + 2, 6
    weights = {p: load_drafter(p, tiny_model).state_dict() for p in (tmp_path / "plain.safetensors",
               tmp_path / "kept.safetensors", snapshot_path(tmp_path / "kept.safetensors", 0.5))}  # fmt: skip
    final, same, early = weights.values()
    assert all(torch.equal(final[k], same[k]) for k in final)
    assert not all(torch.equal(final[k], early[k]) for k in final)
    snap = load_history(snapshot_path(tmp_path / "kept.safetensors", 2))
    assert snap["steps"] == 9 and snap["history"][-1]["step"] == 6 and snap["epochs"] == pytest.approx(2)
    assert snapshot_path(tmp_path / "run.safetensors", 0.5).name == "run.epochs-0.5.safetensors"

    # stopped during step 7: after the step-6 snapshot, before step 8's save
    out = tmp_path / "cut.safetensors"
    with pytest.raises(KeyboardInterrupt):
        train_drafter(fresh(), tiny_model, StopsAt(train, 7), val, tc, out, {}, keep_at=(0.5, 2))
    resumed = train_drafter(fresh(), tiny_model, train, val, tc, out, {}, resume=True, keep_at=(0.5, 2))
    assert resumed["history"] == kept["history"]
    for e in (0.5, 2):
        a, b = (
            load_drafter(snapshot_path(p, e), tiny_model).state_dict()
            for p in (out, tmp_path / "kept.safetensors")
        )
        assert all(torch.equal(a[k], b[k]) for k in a)
