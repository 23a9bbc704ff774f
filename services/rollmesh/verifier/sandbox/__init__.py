"""The code sandbox: the one place untrusted code runs (docs/security.md)."""
