"""verifiers (0.3.x API) environments written here for the bridge's tests (verifier/bridges/verifiers_env.py).

They are loaded by the verifiers virtualenv (scripts/verifiers_venv.py), never by rollmesh's own
interpreter: each module's `load_environment` is what `verifiers.load_environment` calls."""
