"""The rollout scheduler: jobs of rollouts streamed to sinks with backpressure."""
