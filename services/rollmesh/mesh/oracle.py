"""The oracle contract between the scheduler's oracle driver (scheduler/drivers/oracle.py) and an environment
with reference solutions (container tasks: verifier/bridges/container/env.py): a row the driver
marks `ORACLE_ROW_KEY: true` is seeded, then its session's hidden tool `ORACLE_TOOL` (listed
nowhere, answered only for such a row) runs the task's solution; verify then scores it as any
rollout. Rows come from the operator, never from the model, so a model cannot reach the tool."""

ORACLE_ROW_KEY = "oracle"
ORACLE_TOOL = "rollmesh.oracle.solve"
