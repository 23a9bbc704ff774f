"""What produces a rollout: the built-in agent loop, agent programs and their tool endpoint, replays."""
