"""Compiling the engine's programs: the shape buckets every size pads to, XLA's runtime settings
and per-kind compile options, and the store of compiled executables a restart loads."""
