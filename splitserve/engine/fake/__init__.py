"""The fake engine: the Engine interface with hand-checkable arithmetic and no model, for pipeline
tests and overhead measurements."""
