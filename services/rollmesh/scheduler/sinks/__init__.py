"""Where a job's rollouts go: the Sink interface, the JSONL folder (default), a trainer's gRPC RolloutSink."""
