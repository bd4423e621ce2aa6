"""decode_worker process role."""
