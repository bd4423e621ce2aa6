"""What each engine kind does beyond plain sampling, known without building (or importing) it:
the router refuses requests an engine cannot serve before they reach a worker."""

from __future__ import annotations

# Engines whose prefill / insert / generate take LogitsControls and grammar masks (the JAX
# engine joins once its compiled step applies them).
ENGINES_WITH_CONTROLS = frozenset({"fake"})


def supports_controls(engine: str) -> bool:
    return engine in ENGINES_WITH_CONTROLS
