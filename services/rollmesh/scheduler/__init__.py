"""The rollout scheduler: jobs of rollouts streamed to sinks with backpressure."""

#: The scheduler's results root (a job's rows go to <root>/<job_id>/), relative to its working folder.
#: Written once for the scheduler and the commands that start one (`serve scheduler`, `up`, `run`):
#: this package's `__init__` imports nothing, so the CLI reads it without importing the scheduler.
DEFAULT_OUTPUT_DIR = "runs"
