"""Grammar-constrained output (structured output, tool calls) with llguidance.

Why llguidance (docs/grammar.md has the measurements): it compiles a JSON schema in about a
millisecond on SmolLM2's 49,152-token vocabulary (outlines-core builds a whole automaton first:
0.07 s to 24 s for the same schemas), computes a step's mask in microseconds, releases the GIL
while it does, covers recursive schemas, Lark and regex grammars, and is made to take
untrusted grammars (bounded compile and step fuel).

Where the state lives:
 1. The router turns the API's forms (response_format, structured_outputs / guided_*, tool
    choices) into one llguidance grammar (specs.py), refuses invalid ones (400), and sends the
    serialized grammar with the request.
 2. The prefill worker builds a matcher, replays the output so far (a resumed request), and
    hands the engine the first token's mask.
 3. The decode worker builds its own matcher from the same grammar and the tokens so far
    (replay: a matcher is never shipped), advances it by each sampled token, and computes the
    next step's masks in a thread while the loop does its other work (masks.py).
The matcher is built from the model's own token byte table (vocabulary.py).
"""
