"""dspark: DSpark speculative decoding from scratch, small enough to read.

The public API, in the order the data flows (README "Architecture"):

    from dspark import TARGET_CHECKPOINT, TOKENIZER_PATH, Tokenizer, load_target, get_drafter, get_calibration
    from dspark import SamplingParams, speculative_generate, Scheduler, make_policy

    tok = Tokenizer.load(TOKENIZER_PATH)
    target, _ = load_target(TARGET_CHECKPOINT)
    drafter = get_drafter("dspark", target)              # propose(...) -> Proposal
    result = speculative_generate(target, drafter, [tok.chat_prompt("Hi")], 64, SamplingParams(0.0), 7)
    print(tok.decode(result.tokens[0]), result.stats.tau)

Plain decoding is `dspark.decoding.generate` (not re-exported: `dspark.generate` is the command).
"""

# ruff: noqa: E402, F401 (the Ctrl-C hook is set before the imports that load torch; they are re-exports)
import os as _os
import sys as _sys


def _interrupted(
    kind: type[BaseException], value: BaseException, tb: object, previous=_sys.excepthook
) -> None:
    """Ctrl-C while `python -m dspark.<command>` is still importing torch: `interrupted`, exit status 130;
    every other error goes to the previous hook."""
    if not issubclass(kind, KeyboardInterrupt):
        return previous(kind, value, tb)
    try:
        _sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe or stream: nothing more to say there
        pass
    print("interrupted", file=_sys.stderr, flush=True)
    _os._exit(130)  # 128 + SIGINT; sys.exit is not allowed in an excepthook


# before torch loads, and only for `python -m dspark...`
_argv = getattr(_sys, "orig_argv", [])
_module = next((a[2:] or b for a, b in zip(_argv, [*_argv[1:], ""]) if a.startswith("-m")), "")
if _module == "dspark" or _module.startswith("dspark."):
    _sys.excepthook = _interrupted

from dspark.checkpoint import TARGET_CHECKPOINT, TOKENIZER_PATH, CheckpointError, load_target
from dspark.decoding import GenerationResult
from dspark.drafters import DRAFTER_NAMES, get_calibration, get_drafter
from dspark.drafters.base import Drafter, NoDrafter, Proposal, TargetFeatures
from dspark.engine import Engine, EngineResult, Request, SpeculativeResult, speculative_generate
from dspark.kv_cache import KVCache
from dspark.model import ModelConfig, Transformer
from dspark.requests import RoundStats
from dspark.sampling import SamplingParams, probabilities, sample
from dspark.scheduler import (
    POLICY_NAMES,
    Policy,
    Scheduler,
    ThroughputProfile,
    make_policy,
    prefix_schedule,
    prefix_survival,
)
from dspark.tokenizer import Tokenizer
from dspark.verify import VerifyResult, verify, verify_greedy
