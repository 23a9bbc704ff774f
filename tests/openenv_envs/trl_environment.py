"""TRL's GRPOTrainer on a rollmesh environment served by `rollmesh serve openenv`, through OpenEnv's own
client: TRL's `environment_factory` contract (a class with `reset`; its other public methods would be
tools) over `GenericEnvClient`, as TRL's OpenEnv examples wrap an OpenEnv environment. Run in the OpenEnv
virtualenv with TRL installed (it imports openenv and trl, never rollmesh):

    <openenv python> trl_environment.py URL MODEL OUT_DIR

One GRPO step on the dataset rows 0 and 1 (two generations each): each rollout's `reset(index=...)`
starts an episode (the row's question is appended to the prompt), the reward function hands each
completion to its episode as the final turn and takes the episode's reward. Prints one JSON line:
`{"scored": [{"index", "text", "reward"}, ...], "steps": N}`.
"""

import json
import sys

from datasets import Dataset
from openenv.core import GenericEnvClient
from trl import GRPOConfig
from trl import GRPOTrainer

URL, MODEL, OUT = sys.argv[1:4]
SCORED = []


class Arithmetic:
    def __init__(self):
        self.env = GenericEnvClient(base_url=URL).sync()
        self.env.connect()

    def reset(self, index, **kwargs):
        return self.env.reset(index=index).observation["messages"][-1]["content"]


def reward(environments, completions, index, **kwargs):
    rewards = []
    for env, completion, i in zip(environments, completions, index, strict=True):
        text = completion[-1]["content"]
        result = env.env.step({"message": text})
        SCORED.append({"index": i, "text": text, "reward": result.reward, "done": result.done})
        rewards.append(result.reward)
    return rewards


def main():
    prompt = [{"role": "user", "content": "Answer with the number only. "}]
    dataset = Dataset.from_dict({"prompt": [prompt, prompt], "index": [0, 1]})
    config = GRPOConfig(
        output_dir=OUT,
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        max_completion_length=8,
        learning_rate=1e-5,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=MODEL, reward_funcs=[reward], args=config, train_dataset=dataset, environment_factory=Arithmetic
    )
    trainer.train()
    print(json.dumps({"scored": SCORED, "steps": trainer.state.global_step}))


if __name__ == "__main__":
    main()
