"""What each engine kind does beyond plain sampling, known without building (or importing) it:
the router refuses requests an engine cannot serve before they reach a worker."""

from __future__ import annotations

# Engines whose prefill / insert / generate take LogitsControls and grammar masks (the JAX
# engine applies them in its compiled step: jax/controls.py).
ENGINES_WITH_CONTROLS = frozenset({"fake", "jax"})


def supports_controls(engine: str) -> bool:
    return engine in ENGINES_WITH_CONTROLS
