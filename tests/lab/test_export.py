"""`python -m dspark.export` (issue #42): export -> read back gives the same drafter, an engine reads the folder
as this project does (tests/export_reference.py), names/shapes/config fields, d2t, the anchor-first block,
one-line refusals, and an interrupted export that leaves nothing behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from export_reference import dspark_logits, eagle3_logits
from helpers import ANCHOR, CONFIG, GAMMA, K, eagle, parallel

from dspark import export
from dspark.checkpoint import CheckpointError
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import TargetFeatures
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab.cli import run_main
from dspark.lab.exporting import folder as writer
from dspark.lab.exporting.exported import get_drafter
from dspark.lab.exporting.fields import ExportInfo
from dspark.lab.storage import save_checkpoint
from dspark.model import ModelConfig, Transformer
from dspark.sampling import SamplingParams

PARALLEL = [("dflash", 0), ("dspark", 0), ("dspark", K), ("dflash", K)]  # kind, draft vocabulary


@pytest.fixture(scope="module")
def target() -> Transformer:
    torch.manual_seed(0)
    return Transformer(CONFIG).eval()


def propose(drafter, target, temperature: float = 1.0, seed: int = 0):
    """(tokens (γ,), probs (γ, V), confidence (γ,) or None) after the anchor tokens[ANCHOR] of a fixed sequence."""
    tokens = torch.randint(0, CONFIG.vocab_size, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = target(tokens[None, :ANCHOR], return_taps=True)
        drafter.reset(2)
        feats = TargetFeatures(out.taps[0], out.last_hidden[0])
        p = drafter.propose(torch.tensor([1]), tokens[:ANCHOR], feats, torch.tensor([ANCHOR]), tokens[ANCHOR:ANCHOR + 1],
                            GAMMA, SamplingParams(temperature=temperature), torch.Generator().manual_seed(seed))  # fmt: skip
    return tokens, p.tokens[0], p.probs[0], None if p.confidence is None else p.confidence[0]


def exported(drafter, fmt: str, tmp_path: Path) -> Path:
    return writer.export_drafter(drafter, fmt, tmp_path / f"{fmt}-out", ExportInfo(dtype="float32"))


CASES = [(kind, v, "speculators") for kind, v in PARALLEL]
CASES += [(kind, 0, "deepspec") for kind, v in PARALLEL if not v]  # deepspec: the whole vocabulary only
CASES += [("eagle", v, fmt) for v in (0, K) for fmt in ("eagle3", "speculators")]


def build(target, kind, vocab):
    return eagle(target, vocab) if kind == "eagle" else parallel(target, kind, vocab)


@pytest.mark.parametrize("kind, vocab, fmt", CASES)
def test_round_trip_gives_the_same_logits_and_drafts(target, tmp_path, kind, vocab, fmt):
    drafter = build(target, kind, vocab)
    back = get_drafter(kind, target, exported(drafter, fmt, tmp_path))  # through --drafter-checkpoint DIR
    for temperature, seed in ((1.0, 0), (1.0, 5), (0.0, 0)):
        _, tokens, probs, conf = propose(drafter, target, temperature, seed)
        _, tokens_back, probs_back, conf_back = propose(back, target, temperature, seed)
        assert torch.equal(tokens, tokens_back)  # the same drafts for the same uniforms
        torch.testing.assert_close(probs_back, probs, atol=1e-6, rtol=0)
        assert (conf is None) == (conf_back is None)
        if conf is not None:
            torch.testing.assert_close(conf_back, conf, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind, vocab, fmt", CASES)
def test_an_engine_reads_the_folder_as_this_project_drafts(target, tmp_path, kind, vocab, fmt):
    """The reference (DeepSpec / vLLM semantics, from the folder alone) gives draft k the distribution the
    drafter gives it: slot k of the anchor-first block predicts anchor + k + 1, layer ids land on the taps."""
    drafter = build(target, kind, vocab)
    tokens, drafts, probs, conf = propose(drafter, target)
    reference = eagle3_logits if kind == "eagle" else dspark_logits
    out = reference(exported(drafter, fmt, tmp_path), target, tokens, ANCHOR, drafts[:-1])
    logits, ref_conf = out if kind != "eagle" else (out, None)
    torch.testing.assert_close(torch.softmax(logits, -1), probs, atol=2e-5, rtol=0)
    if conf is not None:
        torch.testing.assert_close(ref_conf, conf, atol=2e-5, rtol=0)


def test_a_1_plus_n_block_would_not_read_the_same(target, tmp_path):
    """Read as the 1 + N block (slot k predicts anchor + k), the same weights draft other tokens, and the
    reader refuses such a folder: this project's export must be, and is, anchor-first."""
    drafter = parallel(target, "dspark", K)
    tokens, drafts, probs, _ = propose(drafter, target)
    folder = exported(drafter, "speculators", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["sample_from_anchor"] is True and config["block_size"] == GAMMA
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == GAMMA
    (folder / "config.json").write_text(json.dumps(config | {"sample_from_anchor": False}))
    logits, _ = dspark_logits(folder, target, tokens, ANCHOR, drafts[:-1])
    assert logits.shape[0] == GAMMA - 1  # slots 1..γ-1 only: the anchor's slot is the bonus token's
    assert not torch.allclose(torch.softmax(logits, -1), probs[1:], atol=1e-3)
    with pytest.raises(CheckpointError, match="1 \\+ N"):
        get_drafter("dspark", target, folder)


def shapes(folder: Path) -> dict[str, tuple]:
    from safetensors.torch import load_file

    return {k: (tuple(v.shape), v.dtype) for k, v in load_file(folder / "model.safetensors").items()}


def test_deepspec_names_shapes_and_config_fields(target, tmp_path):
    drafter = parallel(target, "dspark", 0)
    folder = exported(drafter, "deepspec", tmp_path)
    H, V, r, hd, f = CONFIG.dim, CONFIG.vocab_size, 8, CONFIG.head_dim, torch.float32
    layer = {"input_layernorm.weight": (H,), "self_attn.q_proj.weight": (H, H), "self_attn.k_proj.weight": (24, H),
             "self_attn.v_proj.weight": (24, H), "self_attn.o_proj.weight": (H, H), "self_attn.q_norm.weight": (hd,),
             "self_attn.k_norm.weight": (hd,), "post_attention_layernorm.weight": (H,),
             "mlp.gate_proj.weight": (64, H), "mlp.up_proj.weight": (64, H), "mlp.down_proj.weight": (H, 64)}  # fmt: skip
    want = {f"layers.{i}.{k}": (s, f) for i in range(2) for k, s in layer.items()} | {
        "norm.weight": ((H,), f), "fc.weight": ((H, 3 * H), f), "hidden_norm.weight": ((H,), f),
        "embed_tokens.weight": ((V, H), f), "lm_head.weight": ((V, H), f),
        "markov_head.markov_w1.weight": ((V, r), f), "markov_head.markov_w2.weight": ((V, r), f),
        "confidence_head.proj.weight": ((1, H + r), f), "confidence_head.proj.bias": ((1,), f),
    }  # fmt: skip
    assert shapes(folder) == want
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["tie_word_embeddings"] is False
    assert {k: config[k] for k in ("num_hidden_layers", "block_size", "target_layer_ids", "mask_token_id",
                                    "markov_rank", "markov_head_type", "enable_confidence_head",
                                    "confidence_head_with_markov", "rope_theta", "vocab_size")} == {
        "num_hidden_layers": 2, "block_size": GAMMA, "target_layer_ids": [0, 1, 2], "mask_token_id": 5,
        "markov_rank": r, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "rope_theta": CONFIG.rope_theta, "vocab_size": V}  # fmt: skip
    assert "draft_vocab_size" not in config
    assert config["num_anchors"] > 0 and config["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    text = (folder / "README.md").read_text()
    assert "vllm serve" in text and "--speculative-algorithm DSPARK" in text and "Mask token: id 5" in text


VOCAB_ROWS = ("embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight",
              "markov_head.markov_w2.weight")  # fmt: skip


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_every_vocabulary_sized_deepspec_tensor_has_vocab_size_rows(target, tmp_path, kind):
    """What DeepSpec's Qwen3DSparkModel sizes by config.json's vocab_size (it reads no d2t/t2d)."""
    folder = exported(parallel(target, kind, 0), "deepspec", tmp_path)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    got = shapes(folder)
    assert "d2t" not in got and "t2d" not in got and {"embed_tokens.weight", "lm_head.weight"} <= {*got}
    assert {name: got[name][0][0] for name in VOCAB_ROWS if name in got} == {
        name: vocab for name in VOCAB_ROWS if name in got
    }


def test_speculators_and_eagle3_names_and_layer_ids(target, tmp_path):
    folder = exported(parallel(target, "dflash", K), "speculators", tmp_path)
    spec = json.loads((folder / "config.json").read_text())
    assert spec["speculators_model_type"] == "dspark" and spec["markov_rank"] == 0
    assert spec["aux_hidden_state_layer_ids"] == [1, 2, 3]  # DeepSpec id (= tap) + 1
    assert spec["draft_vocab_size"] == K and spec["transformer_layer_config"]["num_hidden_layers"] == 2
    assert spec["enable_confidence_head"] is False and spec["tie_word_embeddings"] is False
    folder = exported(eagle(target, K), "eagle3", tmp_path)
    H, f = CONFIG.dim, torch.float32
    got = shapes(folder)
    assert got["fc.weight"] == ((H, 3 * H), f) and got["lm_head.weight"] == ((K, H), f)
    assert {got[f"midlayer.self_attn.{p}_proj.weight"][0][1] for p in "qkv"} == {2 * H}
    assert {
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "norm.weight",
        "d2t",
        "t2d",
    } <= {*got}
    assert "embed_tokens.weight" not in got  # the engines share the target's
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["tie_word_embeddings"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and config["draft_vocab_size"] == K


def test_d2t_maps_every_draft_index_to_its_target_id(target, tmp_path):
    """The speculators layout (deepspec refuses a reduced vocabulary: tests/lab/test_export_guards.py)."""
    from safetensors.torch import load_file

    drafter = parallel(target, "dspark", K)
    w = load_file(exported(drafter, "speculators", tmp_path) / "model.safetensors")
    ids = torch.arange(K) + w["d2t"]
    assert w["d2t"].dtype == torch.int64 and torch.equal(ids, drafter.vocab.ids.sort().values)
    assert torch.equal(w["t2d"].nonzero().flatten(), ids) and (ids[1:] > ids[:-1]).all()
    torch.testing.assert_close(w["lm_head.weight"], target.lm_head.weight[ids].detach(), atol=0, rtol=0)
    w2_rows = drafter.head.w2.weight[drafter.vocab.to_draft(ids)].detach()  # row i: the target id ids[i]
    torch.testing.assert_close(w["markov_head.markov_w2.weight"], w2_rows, atol=0, rtol=0)


def test_without_dspark_json_the_distribution_is_kept(target, tmp_path):
    """A folder from elsewhere has no dspark.json: the ids come back ascending, q over the target is the same
    and so is every greedy draft (sampled drafts may differ: the inverse CDF walks the ids in another order)."""
    drafter = parallel(target, "dspark", K)
    folder = exported(drafter, "speculators", tmp_path)
    (folder / "dspark.json").unlink()
    back = get_drafter("dspark", target, folder)
    assert (back.vocab.ids[1:] > back.vocab.ids[:-1]).all()
    _, _, probs, _ = propose(drafter, target, 1.0)
    _, _, probs_back, _ = propose(back, target, 1.0)
    torch.testing.assert_close(probs_back[0], probs[0], atol=1e-6, rtol=0)  # draft 1: before any draw differs
    _, tokens, probs, _ = propose(drafter, target, 0.0)
    _, tokens_back, probs_back, _ = propose(back, target, 0.0)
    assert torch.equal(tokens, tokens_back)
    torch.testing.assert_close(probs_back, probs, atol=1e-6, rtol=0)


REFUSALS = [
    (lambda t: parallel(t, "dspark", qk_norm=False), "deepspec", "q/k RMSNorm"),
    (lambda t: parallel(t, "dspark-rnn"), "speculators", "RNN head"),
    (lambda t: eagle(t, eagle3_layer=False), "eagle3", "2 x dim attention input"),
    (lambda t: eagle(t), "deepspec", "for eagle use --format eagle3"),
    (lambda t: AutoregressiveDrafter(t, AutoregressiveDrafterConfig("mtp", 1, ffn_hidden=64)), "speculators",
     "no engine layout holds mtp"),
]  # fmt: skip


@pytest.mark.parametrize("make, fmt, expected", REFUSALS)
def test_what_a_format_cannot_hold_is_refused_in_one_line(target, tmp_path, make, fmt, expected):
    with pytest.raises(ValueError, match=expected) as info:
        writer.export_drafter(make(target), fmt, tmp_path / "out", ExportInfo())
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_a_tap_on_the_last_layer_or_two_taps_are_refused(tmp_path):
    for taps, fmt, expected in (((0, 3), "deepspec", "last layer"), ((0, 2), "eagle3", "fuses 3")):
        torch.manual_seed(0)
        t = Transformer(ModelConfig(**(CONFIG.to_dict() | {"tap_layers": taps})))
        drafter = eagle(t) if fmt == "eagle3" else parallel(t, "dspark")
        with pytest.raises(ValueError, match=expected):
            writer.export_drafter(drafter, fmt, tmp_path / "out", ExportInfo())


def test_an_interrupted_export_leaves_no_half_written_folder(target, tmp_path, monkeypatch):
    drafter = parallel(target, "dspark", K)

    def disk_full(tensors, path, metadata=None):
        Path(path).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "save_file", disk_full)
    with pytest.raises(OSError):
        writer.export_drafter(drafter, "speculators", tmp_path / "new", ExportInfo())
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary twin
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text("{}")
    (tmp_path / "old" / "dspark.json").write_text('{"written_by": "python -m dspark.export"}')  # an export
    with pytest.raises(OSError):
        writer.export_drafter(drafter, "speculators", tmp_path / "old", ExportInfo(), replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]  # the old folder, untouched
    assert (tmp_path / "old" / "config.json").read_text() == "{}"


def test_the_command_exports_and_generate_reads_it_back(small_checkpoint, tmp_path, capsys):
    """CLI end to end on the small target: a q/k-norm dspark checkpoint -> deepspec folder -> --drafter-checkpoint."""
    from dspark import generate
    from dspark.checkpoint import load_target

    small, _ = load_target(small_checkpoint)
    torch.manual_seed(0)
    config = ParallelDrafterConfig("dspark", 3, 1, 32, rank=4, qk_norm=True)
    save_checkpoint(ParallelDrafter(small, config), config, tmp_path / "d.safetensors")
    argv = ["--checkpoint", str(small_checkpoint), "--drafter-checkpoint", str(tmp_path / "d.safetensors"),
            "--out", str(tmp_path / "served")]  # fmt: skip
    assert run_main(export.main, argv) == 0
    assert {p.name for p in (tmp_path / "served").iterdir()} == {"config.json", "model.safetensors", "README.md",
                                                                 "dspark.json"}  # fmt: skip
    assert run_main(export.main, argv) == 2 and "already exists" in capsys.readouterr().err
    gen = ["hello", "--checkpoint", str(small_checkpoint), "--drafter", "dspark", "--drafter-checkpoint",
           str(tmp_path / "served"), "--max-new-tokens", "6", "--temperature", "0"]  # fmt: skip
    assert run_main(generate.main, gen) == 0
    shutil.rmtree(tmp_path / "served")


def test_help_explains_the_formats(capsys):
    with pytest.raises(SystemExit) as exit_info:
        export.main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "usage: python -m dspark.export" in out
    assert all(word in out for word in ("deepspec", "speculators", "eagle3", "--qk-norm", "--eagle3-layer"))
