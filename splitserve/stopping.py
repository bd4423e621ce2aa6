"""Token-level finish rules, shared by the prefill worker (output position 0) and the decode worker.

Stop strings are not here: they need text, so the detok worker finds them.
"""

from __future__ import annotations

from splitserve.protocol import StopCriteria, TokenFinish


def token_finish(
    stop: StopCriteria, token: int, generated: int, context_len: int, max_seq_len: int
) -> TokenFinish:
    """Why `token` ends its request, if it does.

    generated counts output tokens including this one; context_len counts prompt and output tokens.
    eos and stop token ids do not count as a finish before min_tokens (they are then ordinary
    tokens); ignore_eos disables eos only, never the client's own stop_token_ids.
    """
    if generated >= stop.min_tokens:
        if token in stop.stop_token_ids or (not stop.ignore_eos and token in stop.eos_ids):
            return TokenFinish.STOP_TOKEN
    if generated >= stop.max_tokens or context_len >= max_seq_len:
        return TokenFinish.LENGTH
    return TokenFinish.NONE
