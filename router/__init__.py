"""router process role."""
