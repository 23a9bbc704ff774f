"""Container tasks (Harbor's format): a folder of task folders is a dataset and an environment; each
rollout works in a machine of its own, from a provider behind one interface (provider.py): the
daemonless one on the project's confinement (daemonless.py) or Docker (docker.py). The environment
is env.py; docs/container-tasks.md says what is and is not isolated."""
