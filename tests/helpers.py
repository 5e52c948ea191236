"""Helpers shared by test files in several folders (tests/conftest.py puts tests/ on sys.path): the tiny
target's config, prompts, drafters, the micro target of the exactness checks, and the broken files of the
one-line error tables."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import torch

from dspark.checkpoint import config_path, load_target
from dspark.drafters import load_drafter
from dspark.drafters.autoregressive import AutoregressiveDrafter, AutoregressiveDrafterConfig
from dspark.drafters.base import Drafter, NoDrafter, Proposal, TargetFeatures
from dspark.drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from dspark.lab import profiles, step_cost
from dspark.lab.cost_aware import draft_cost
from dspark.lab.cpu_speed import fast_on_cpu
from dspark.lab.draft_vocab import build_drafter
from dspark.model import ModelConfig, Transformer
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams, probabilities
from dspark.scheduler import ThroughputProfile
from dspark.training import FeatureBatch

TINY = ModelConfig(
    vocab_size=97,  # not a power of two on purpose
    dim=48,
    n_layers=3,
    n_heads=4,
    n_kv_heads=2,
    ffn_hidden=80,
    max_seq_len=64,
    tap_layers=(0, 1),
)


GREEDY = SamplingParams(temperature=0.0)


class OracleDrafter(Drafter):
    """Test double: proposes the target's own greedy continuation, corrupting each token with
    probability `noise` (its own RNG). Long accepted runs put EOS and max-new-tokens inside blocks."""

    name = "oracle"

    def __init__(self, target: Transformer, max_gamma: int, noise: float) -> None:
        super().__init__()
        self.target, self.max_gamma, self.noise = target, max_gamma, noise
        self.rng = torch.Generator().manual_seed(123)

    def reset(self, n_slots):
        self.history = {s: [] for s in range(n_slots)}

    def release(self, slot):
        self.history[slot] = []

    @torch.no_grad()
    def propose(self, slots, committed_tokens, features, committed_lens, anchors, gamma, params, generator):
        drafts = []
        for slot, chunk, anchor in zip(
            slots.tolist(), committed_tokens.split(committed_lens.tolist()), anchors
        ):
            self.history[slot] += chunk.tolist()
            seq, block = [*self.history[slot], int(anchor)], []
            for _ in range(gamma):
                ctx = seq[-self.target.config.max_seq_len :]
                token = int(self.target(torch.tensor([ctx])).logits[0, -1].argmax())
                if float(torch.rand(1, generator=self.rng)) < self.noise:
                    token = int(torch.randint(0, self.target.config.vocab_size, (1,), generator=self.rng))
                block.append(token)
                seq.append(token)
            drafts.append(block)
        tokens = torch.tensor(drafts, dtype=torch.long).view(len(drafts), gamma)
        return Proposal(tokens, torch.nn.functional.one_hot(tokens, self.target.config.vocab_size).float())


def copy_initialised(drafter: AutoregressiveDrafter) -> AutoregressiveDrafter:
    """Make a random drafter predict 'repeat the token' (identity layers, embedding-only entry):
    the tiny random target repeats itself a lot, so many drafts get accepted."""
    dim = drafter.target.config.dim
    with torch.no_grad():
        drafter.w_in.weight.zero_()
        drafter.w_in.weight[:, :dim] = torch.eye(dim)
        for layer in drafter.layers:
            layer.attn.wo.weight.zero_()
            layer.ffn.w_down.weight.zero_()
    return drafter


def make_drafter(kind: str, target: Transformer, gamma: int) -> Drafter:
    if kind == "none":
        return NoDrafter(target.config.vocab_size)
    if kind == "oracle":
        return OracleDrafter(target, max(gamma, 1), noise=0.25)
    torch.manual_seed(5)
    if kind == "mtp":
        return AutoregressiveDrafter(target, AutoregressiveDrafterConfig("mtp", 1, ffn_hidden=64))
    drafter = AutoregressiveDrafter(
        target, AutoregressiveDrafterConfig("eagle", max(gamma, 1), ffn_hidden=64)
    )
    return copy_initialised(drafter) if kind == "eagle-copy" else drafter


def prompts(lengths, seed=0, vocab=TINY.vocab_size):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


RAGGED = [3, 17, 1, 9, 45, 60]  # the last two hit the 64-token context inside a block


# ---- exact sampling, end to end ------------------------------------------------------------
MICRO = ModelConfig(vocab_size=5, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=24, max_seq_len=16,
                    tap_layers=(0, 1))  # fmt: skip


MICRO_PROMPT, MICRO_LENGTH = [1, 3, 0], 3  # the exactness checks decode 3 tokens after this prompt


def micro_target_and_law() -> tuple[Transformer, torch.Tensor]:
    """The vocab-5 target of the exactness checks (sharpened a little so drafters are
    sometimes right) and the exact law of its 3 tokens after MICRO_PROMPT at T = 1."""
    torch.manual_seed(0)
    target = Transformer(MICRO).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    return target, exact_joint(target, MICRO_PROMPT, SamplingParams(temperature=1.0), MICRO_LENGTH)


def exact_joint(model: Transformer, prompt: list[int], params: SamplingParams, length: int) -> torch.Tensor:
    """P(x1..x_length | prompt) for every sequence, by enumerating all prefixes."""
    V = model.config.vocab_size
    joint = torch.zeros([V] * length, dtype=torch.float64)
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=length):
            p = 1.0
            for k in range(length):
                logits = model(torch.tensor([prompt + list(seq[:k])])).logits[0, -1]
                p *= float(probabilities(logits, params)[seq[k]])
            joint[seq] = p
    return joint


PROFILE = ThroughputProfile([1 / (1.0 + 0.05 * B) for B in range(1, 257)])


LENGTHS = [3, 17, 1, 9, 45, 60, 5, 30, 12, 2]  # 45 and 60 hit the 64-token context


def make(target, kind, gamma=4, rank=8, seed=0):
    torch.manual_seed(seed)
    mask_id = min(5, target.config.vocab_size - 1)
    config = ParallelDrafterConfig(kind, gamma=gamma, ffn_hidden=64, rank=rank, mask_id=mask_id)
    drafter = ParallelDrafter(target, config)
    if kind != "dflash":  # a non-trivial sequential head (W2 starts at zero)
        torch.nn.init.normal_(drafter.head.w2.weight, std=0.5)
    return drafter.eval()


def live(target, tokens, lengths, prompt_lens) -> FeatureBatch:
    with torch.no_grad():
        out = target(tokens, return_taps=True)
    return FeatureBatch(tokens, torch.tensor(lengths), torch.tensor(prompt_lens), out.taps, out.last_hidden)


ATOL = 2e-5


def full_logits(model, seq: torch.Tensor):
    with torch.no_grad():
        out = model(seq[None], return_taps=True)
    return out.logits[0], out.taps[0]


def run_blocks(model, cache, seqs, slots, schedule):
    """Feed each sequence through `slots` in ragged blocks; schedule[step] = {seq index: block length}.
    Returns per-sequence concatenated logits and taps of everything fed."""
    pos = [0] * len(seqs)
    got_logits = [[] for _ in seqs]
    got_taps = [[] for _ in seqs]
    for blocks in schedule:
        order = sorted(blocks)
        tokens = torch.cat([seqs[i][pos[i] : pos[i] + blocks[i]] for i in order])
        lens = torch.tensor([blocks[i] for i in order])
        with torch.no_grad():
            out = model.forward_cached(
                tokens, torch.tensor([slots[i] for i in order]), lens, cache, return_taps=True
            )
        for i, logits, taps in zip(order, out.logits.split(lens.tolist()), out.taps.split(lens.tolist())):
            got_logits[i].append(logits)
            got_taps[i].append(taps)
            pos[i] += blocks[i]
    return [torch.cat(x) for x in got_logits], [torch.cat(x) for x in got_taps], pos


def synthetic_rounds(
    n: int, gamma: int, true_temps: list[float], seed: int = 0, true_shifts: list[float] | None = None
) -> RoundStats:
    """Raw confidences c; the real conditional acceptance is σ(logit(c)/T_k - b_k): the head is
    overconfident where T_k > 1 or b_k > 0. Full verification, accepted = leading successes."""
    g = torch.Generator().manual_seed(seed)
    conf = torch.sigmoid(torch.randn(n, gamma, generator=g) * 2 + 1.5).double()
    shifts = torch.tensor(true_shifts or [0.0] * gamma).double()
    true = torch.sigmoid(torch.logit(conf) / torch.tensor(true_temps).double() - shifts)
    success = torch.rand(n, gamma, generator=g).double() < true
    accepted = success.long().cumprod(1).sum(1)
    return RoundStats.from_lists(
        [[gamma] for _ in range(n)], [[int(a)] for a in accepted], [[c] for c in conf.tolist()]
    )


def propose_once(drafter, model, gamma=4):
    drafter.reset(2)
    torch.manual_seed(0)
    n_taps = len(model.config.tap_layers)
    feats = TargetFeatures(torch.randn(7, n_taps, model.config.dim), torch.randn(7, model.config.dim))
    return drafter.propose(torch.tensor([0, 1]), torch.arange(7), feats, torch.tensor([3, 4]),
                           torch.tensor([5, 6]), gamma, SamplingParams(1.0), torch.Generator().manual_seed(3))  # fmt: skip


def linear_profile(fixed: float, per_token: float, max_tokens: int = 64) -> ThroughputProfile:
    return ThroughputProfile([1 / (fixed + per_token * B) for B in range(1, max_tokens + 1)])


ROOT = Path(__file__).resolve().parents[1]


# ---- broken files for the one-line error table of tests/lab/test_bad_inputs.py -------------------------------
def broken_calibrations(root: Path, drafter: Path) -> dict[str, str]:
    """Copies of the small γ = 3 dspark drafter whose JSON holds a calibration that is too short (cal_short),
    holds NaN (cal_nan) or a negative temperature (cal_negative); NAME_json is the JSON's path."""
    out = {}
    for name, temps in (
        ("cal_short", [1.0, 1.0]),
        ("cal_nan", [1.0, math.nan, 1.0]),
        ("cal_negative", [1.0, -0.5, 1.0]),
    ):
        path = root / f"{name}.safetensors"
        shutil.copy(drafter, path)
        record = json.loads(config_path(drafter).read_text())
        record["calibration"] = {"sts_temperatures": temps, "sts_shifts": [0.0] * len(temps)}
        config_path(path).write_text(json.dumps(record))  # NaN is written as NaN, which json reads back
        out[name], out[f"{name}_json"] = str(path), str(config_path(path))
    return out


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 3,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80,
             "max_position_embeddings": 64, "tie_word_embeddings": True}  # fmt: skip


HUGE = {"vocab_size": 2**24, "hidden_size": 2**20, "num_hidden_layers": 1000, "num_attention_heads": 16,
        "num_key_value_heads": 16, "intermediate_size": 2**22}  # fmt: skip


def broken_hf_configs(root: Path) -> dict[str, str]:
    """Hugging Face-layout folders whose config.json is a JSON list (hf_list), says 2.7 layers (hf_fraction) or
    describes a model no machine holds (hf_huge); none needs weights: each is refused before they are read."""
    configs = {
        "hf_list": [1, 2],
        "hf_fraction": {**HF_CONFIG, "num_hidden_layers": 2.7},
        "hf_huge": {**HF_CONFIG, **HUGE},
    }
    out = {}
    for name, config in configs.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        out[name] = str(root / name)
    return out


def committed_drafts(stats: RoundStats) -> int:
    """Drafts that reached the output: min(a, e) per round (e <= a: the stop came inside the accepted drafts)."""
    return sum(min(a, e) for accs, emits in zip(stats.accepted, stats.emitted) for a, e in zip(accs, emits))


SHORT = [3, 17, 1, 9]  # far from the 64-token context: nothing caps the verify lengths


# ---- profile caches: corrupt files are named, --refresh rebuilds them and the caches inside them ----------
def cache_names(checkpoint: Path, drafter_checkpoint: Path) -> dict[str, str]:
    """The files under DSPARK_HOME/profiles that `bench profile --checkpoint C --drafters d=D` reads: the SPS
    profile, the engine's drafting cost and the `propose` table that cost draws on. Target and drafter as the
    commands load them: with the CPU speed path, which their keys name."""
    target = fast_on_cpu(load_target(checkpoint)[0])
    drafter = fast_on_cpu(load_drafter(drafter_checkpoint, target))
    gamma = drafter.max_gamma
    paths = {
        "sps": profiles.profile_path(profiles.cpu_profile_key(target)),
        "engine": draft_cost.draft_cost_path(step_cost.engine_draft_cost_key(target, drafter, gamma)),
        "propose": draft_cost.draft_cost_path(draft_cost.draft_cost_key(target, drafter, gamma)),
    }
    return {which: path.name for which, path in paths.items()}


def corrupt_cache_homes(root: Path, checkpoint: Path, drafter_checkpoint: Path) -> dict[str, str]:
    """DSPARK_HOMEs (for tests/lab/test_bad_inputs.py's table) whose SPS profile is empty (`empty_sps_home`; the
    file: `empty_sps`) or not JSON (`garbage_sps...`), or whose engine drafting cost is empty
    (`empty_draft...`)."""
    names = cache_names(checkpoint, drafter_checkpoint)
    out = {}
    for name, which, text in (("empty_sps", "sps", ""), ("garbage_sps", "sps", '{"key": '),
                              ("empty_draft", "engine", "")):  # fmt: skip
        home = root / f"{name}_home"
        path = home / "profiles" / names[which]
        path.parent.mkdir(parents=True)
        path.write_text(text)
        out |= {f"{name}_home": str(home), name: str(path)}
    return out


CONFIG = ModelConfig(vocab_size=97, dim=48, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=80, max_seq_len=64,
                     tap_layers=(0, 1, 2))  # fmt: skip


GAMMA, K, ANCHOR = 4, 30, 12


def randomise(drafter, vocab: int):
    """Norm weights off 1 and a non-zero sequential head (so a swapped name shows), ids in a shuffled order."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name or name.startswith("head.w2"):
                p.normal_(1.0 if "norm" in name else 0.0, 0.4)
    if vocab:
        shuffled = torch.randperm(CONFIG.vocab_size, generator=torch.Generator().manual_seed(3))
        drafter.vocab.set_ids(shuffled[:vocab])
    return drafter.eval()


def parallel(target, kind: str, vocab: int = 0, **options) -> ParallelDrafter:
    options = {"qk_norm": True} | options
    config = ParallelDrafterConfig(kind, GAMMA, 2, 64, rank=8, mask_id=5, draft_vocab=vocab, **options)
    return randomise(build_drafter(target, config), vocab)


def eagle(target, vocab: int = 0, **options) -> AutoregressiveDrafter:
    options = {"eagle3_layer": True} | options
    config = AutoregressiveDrafterConfig("eagle", GAMMA, 1, 64, draft_vocab=vocab, **options)
    return randomise(build_drafter(target, config), vocab)


def on_meta(run):
    """run() outside and then inside the meta default-device context; both results, as plain values."""
    expected = run()
    with torch.device("meta"):
        got = run()
    return expected, got
