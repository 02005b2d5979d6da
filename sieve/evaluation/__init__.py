"""Offline evaluation: IR metrics and the `sieve eval` runner."""
