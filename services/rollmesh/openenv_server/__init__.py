"""`rollmesh serve openenv`: any rollmesh environment as an OpenEnv environment server, for
OpenEnv's own clients and what is built on them (TRL's environment wrappers).

A front door beside the verifier, not part of it: it plays OpenEnv episodes through the verifier's
gRPC environment API (the same seed / tool / step / verify calls the built-in agent loop makes), so
every kind of environment (built-in, NeMo Gym, verifiers, reasoning-gym, container tasks) is served
the same way. `wire.py` is OpenEnv's wire format and rollmesh's action/observation models in it,
`episode.py` one episode, `app.py` the HTTP and WebSocket routes, `server.py` the command's
server. docs/openenv.md is the user's page.
"""

#: The server's defaults, `rollmesh serve openenv`'s and `server.openenv_server`'s (written once, so
#: the command and the API agree): OpenEnv's own port, and the turns after which an episode ends.
DEFAULT_PORT = 8000
DEFAULT_MAX_STEPS = 8
