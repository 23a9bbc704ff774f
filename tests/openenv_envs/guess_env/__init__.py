"""A number-guessing OpenEnv environment written with openenv-core's API, for rollmesh's tests of its
OpenEnv host bridge (served in the OpenEnv virtualenv, never imported by rollmesh)."""
