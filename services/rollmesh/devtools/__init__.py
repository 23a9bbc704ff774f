"""Tools for tests, fault injection and benchmarks; never imported by a service."""
