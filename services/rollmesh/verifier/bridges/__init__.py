"""Foreign environments behind the one Environment API: NeMo Gym resources servers, verifiers environments."""
