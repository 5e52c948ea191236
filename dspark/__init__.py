"""dspark: DSpark speculative decoding from scratch, small enough to read.

The public API, in the order the data flows (README "Architecture"):

    from dspark import Tokenizer, load_target, get_drafter, get_calibration
    from dspark import SamplingParams, speculative_generate, Scheduler, make_policy

    tok = Tokenizer.load(paths.TOKENIZER_PATH)
    target, _ = load_target(paths.TARGET_CHECKPOINT)
    drafter = get_drafter("dspark", target)              # propose(...) -> Proposal
    result = speculative_generate(target, drafter, [tok.chat_prompt("Hi")], 64, SamplingParams(0.0), 7)
    print(tok.decode(result.tokens[0]), result.stats.tau)

Everything else (the training pipelines, the offline study, the simulator, plots) is
imported from the lab: `dspark.lab.training`, `dspark.lab.study`. Plain decoding is
`dspark.decoding.generate`; it is not re-exported here, because
`dspark.generate` is the command module (`python -m dspark.generate`).
"""

# `interrupt` first (before torch loads): under `python -m dspark...` Ctrl-C while starting is `interrupted`, 130
from dspark import interrupt, paths  # noqa: F401
from dspark.checkpoint import CheckpointError, load_target
from dspark.config import ModelConfig
from dspark.decoding import GenerationResult
from dspark.drafters.base import Drafter, NoDrafter, Proposal, TargetFeatures
from dspark.drafters.registry import DRAFTER_NAMES, get_calibration, get_drafter
from dspark.kv_cache import KVCache
from dspark.model import Transformer
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.scheduling.scheduler import (
    POLICY_NAMES,
    Policy,
    Scheduler,
    ThroughputProfile,
    make_policy,
    prefix_schedule,
    prefix_survival,
)
from dspark.serving.engine import Engine, EngineResult, Request
from dspark.serving.rounds import RoundStats
from dspark.serving.speculative import SpeculativeResult, speculative_generate
from dspark.tokenizer import Tokenizer
from dspark.verify import VerifyResult, verify, verify_greedy

__all__ = [
    "DRAFTER_NAMES",
    "POLICY_NAMES",
    "CheckpointError",
    "Drafter",
    "Engine",
    "EngineResult",
    "GenerationResult",
    "KVCache",
    "ModelConfig",
    "NoDrafter",
    "Policy",
    "Proposal",
    "Request",
    "RoundStats",
    "SamplingParams",
    "SpeculativeResult",
    "TargetFeatures",
    "ThroughputProfile",
    "Tokenizer",
    "Transformer",
    "Scheduler",
    "VerifyResult",
    "get_calibration",
    "get_drafter",
    "load_target",
    "make_policy",
    "paths",
    "prefix_schedule",
    "prefix_survival",
    "probabilities",
    "sample",
    "speculative_generate",
    "verify",
    "verify_greedy",
]
