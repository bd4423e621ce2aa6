"""splitserve: disaggregated LLM serving (prefill, decode, a detokenizer pool, a router)."""

__version__ = "0.1.0"
