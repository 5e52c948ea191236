"""dspark/__init__.py: the public API example runs as written (Ctrl-C while importing: tests/lab/test_interrupt.py)."""

from __future__ import annotations


def test_the_public_api_example_runs_and_is_plain_decoding_at_t0():
    """The example at the top of dspark/__init__.py, as written, on the shipped tiny target: the API names it
    imports exist, and the speculative reply at T = 0 is token for token plain decoding's (the core's central
    invariant, reached the way a reader of the package's docstring would)."""
    import dspark

    example = dspark.__doc__.split("The public API", 1)[1].split("Plain decoding is", 1)[0]
    code = "\n".join(line[4:] for line in example.splitlines() if line.startswith("    "))
    assert "speculative_generate(" in code and "get_drafter(" in code
    code = code.replace("print(", "reply = (")  # keep the result instead of printing it
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - the package's own docstring
    result, tok = scope["result"], scope["tok"]
    from dspark.decoding import generate

    plain = generate(scope["target"], [tok.chat_prompt("Hi")], 64, dspark.SamplingParams(0.0))
    assert result.tokens == plain.tokens and result.stats.tau >= 1.0
    assert scope["reply"][0] == tok.decode(result.tokens[0])
