"""prefill_worker process role."""
