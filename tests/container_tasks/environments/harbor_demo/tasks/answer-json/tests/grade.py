"""Named rewards: `reward` (all right), `parsed` (valid JSON), `answer` (the number), `unit` (0.5 weight)."""

import json

rewards = {"reward": 0.0, "parsed": 0.0, "answer": 0.0, "unit": 0.0}
try:
    with open("/app/answer.json") as f:
        data = json.load(f)
    rewards["parsed"] = 1.0
    rewards["answer"] = 1.0 if data.get("answer") == 42 else 0.0
    rewards["unit"] = 0.5 if data.get("unit") == "none" else 0.0
    rewards["reward"] = 1.0 if rewards["answer"] and rewards["unit"] else 0.0
except (OSError, ValueError, AttributeError):
    pass
with open("/logs/verifier/reward.json", "w") as f:
    json.dump(rewards, f)
