"""An MCP OpenEnv environment (openenv-core's MCPEnvironment over a FastMCP server) for rollmesh's
tests of its OpenEnv host bridge: its tools are listed per episode and called as CallToolActions
(served in the OpenEnv virtualenv, never imported by rollmesh)."""
