"""Pure functions from samples and traces to numbers."""
