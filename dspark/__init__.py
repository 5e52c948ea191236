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

import importlib

# the public API, by the module that defines it; imported on first use, so that `python -m dspark.<command>`
# can set up its Ctrl-C handling (dspark/lab/interrupt.py) before torch loads
_PUBLIC = {
    "dspark.checkpoint": "TARGET_CHECKPOINT TOKENIZER_PATH CheckpointError load_target",
    "dspark.drafters": "DRAFTER_NAMES get_calibration get_drafter",
    "dspark.drafters.base": "Drafter NoDrafter Proposal TargetFeatures",
    "dspark.engine": "Engine Request Run speculative_generate",
    "dspark.kv_cache": "KVCache",
    "dspark.model": "ModelConfig Transformer",
    "dspark.requests": "RoundStats",
    "dspark.sampling": "SamplingParams probabilities sample",
    "dspark.scheduler": "POLICY_NAMES Policy Scheduler ThroughputProfile make_policy prefix_schedule prefix_survival",
    "dspark.tokenizer": "Tokenizer",
    "dspark.verify": "VerifyResult verify_greedy",  # `verify` itself: from dspark.verify (its module's name)
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names.split()}
__all__ = list(_MODULE_OF)


def __getattr__(name: str) -> object:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'dspark' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)
