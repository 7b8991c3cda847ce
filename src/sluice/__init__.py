"""sluice."""
