"""The container-task kind's failures, each with its status code and ErrorInfo reason. None of them
is ever a reward of 0: a rollout whose machine or grader failed has no verdict, and says why."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class BadHarborTask(mesh.InvalidArgument):
    """A task folder rollmesh cannot read (task.toml, instruction.md, tests/test.sh) or a row that
    names no task of the environment; the message names the task and the field."""

    reason = "BAD_HARBOR_TASK"


class ProviderUnavailable(mesh.FailedPrecondition):
    """The provider cannot run machines here: not root, no overlayfs, no Docker daemon."""

    reason = "CONTAINER_PROVIDER_UNAVAILABLE"


class ImageBuildFailed(mesh.FailedPrecondition):
    """The task's image could not be built: a RUN step failed, a base image is not available here,
    a Dockerfile instruction the provider does not support (named)."""

    reason = "IMAGE_BUILD_FAILED"


class ImageBuildTimeout(mesh.DeadlineExceeded):
    """The image build overran the task's `build_timeout_sec`."""

    reason = "IMAGE_BUILD_TIMEOUT"


class StorageLimitUnsupported(mesh.FailedPrecondition):
    """The task sets a storage limit the provider cannot enforce here (Docker's overlay2 without XFS
    project quotas), and the environment does not accept it unenforced."""

    reason = "STORAGE_LIMIT_UNSUPPORTED"


class ServicesUnsupported(mesh.FailedPrecondition):
    """The task's compose file runs services besides `main` and the provider runs the main service
    alone (the daemonless one); the message names the services."""

    reason = "COMPOSE_SERVICES_UNSUPPORTED"


class MachineStartFailed(mesh.Unavailable):
    """The rollout's machine did not come up (retryable)."""

    reason = "MACHINE_START_FAILED"


class MachineLost(mesh.Unavailable):
    """The rollout's machine died under it (its init was killed, the host reclaimed it): what the
    agent did is gone, so the rollout is retried from its seed rather than scored."""

    reason = "MACHINE_LOST"


class TestScriptFailed(mesh.FailedPrecondition):
    """tests/test.sh exited non-zero (or was killed) without writing a reward: the grader crashed."""

    reason = "TEST_SCRIPT_FAILED"
    __test__ = False  # not a pytest class


class TestTimeout(mesh.DeadlineExceeded):
    """tests/test.sh overran the task's verifier timeout and was killed."""

    reason = "TEST_TIMEOUT"
    __test__ = False  # not a pytest class


class NoRewardFile(mesh.FailedPrecondition):
    """tests/test.sh ended without writing /logs/verifier/reward.txt or reward.json."""

    reason = "NO_REWARD_FILE"


class BadRewardFile(mesh.FailedPrecondition):
    """The reward file is not a finite number (reward.txt), not a JSON object of finite numbers
    (reward.json), or lacks the reward the environment is configured to take."""

    reason = "BAD_REWARD_FILE"


class NoSolution(mesh.FailedPrecondition):
    """An oracle run of a task without solution/solve.sh: nothing to run (the task is not scored)."""

    reason = "NO_SOLUTION"
