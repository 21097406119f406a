"""pytest plugin: fixtures for testing apps built on mhqa-graph."""
