"""detok_worker process role."""
