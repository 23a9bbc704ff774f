"""What every rollmesh server shares: bootstrap, errors, auth, logging, configuration (one module
each; DESIGN.md lists them)."""
