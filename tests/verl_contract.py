"""Run in verl's environment (scripts/verl_env.py first on PYTHONPATH) by
tests/integration/test_verl_agent_loop.py: verl's own RLHFDataset reads a parquet file of verl rows
(agent_name "rollmesh", the rollmesh row in extra_info), and each sample goes through
`RollmeshAgentLoop.run` (constructed as verl's AgentLoopWorker constructs agent loops) against the mesh
at ROLLMESH_*_ADDR; verl's own `AgentLoopOutput.as_dict` makes the tensors. Prints one JSON line: per
sample, the loop's output and the tensors' lists (or the failure it raised), and the registry entry.

    python tests/verl_contract.py ROWS.parquet MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def main(parquet: str, model_dir: str) -> dict[str, Any]:
    import transformers
    import verl
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from rollmesh_client.verl import RollmeshAgentLoop
    from rollmesh_client.verl import RollmeshRolloutFailed

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data_config = OmegaConf.create(
        {"prompt_key": "prompt", "max_prompt_length": 2048, "filter_overlong_prompts": False}
    )
    dataset = RLHFDataset(data_files=[parquet], tokenizer=tokenizer, config=data_config, processor=None)
    trainer_config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 64}}}
    )
    loop = RollmeshAgentLoop(
        trainer_config=DictConfigWrap(trainer_config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(data_config),
    )
    samples = []
    for i in range(len(dataset)):
        fields = dataset[i]
        try:
            out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **fields)
        except RollmeshRolloutFailed as exc:
            samples.append({"failed": str(exc)})
            continue
        tensors = out.as_dict()
        samples.append(
            {
                "agent_name": fields.get("agent_name"),
                "prompt_ids": out.prompt_ids,
                "response_ids": out.response_ids,
                "response_mask": out.response_mask,
                "response_logprobs": out.response_logprobs,
                "reward_score": out.reward_score,
                "num_turns": out.num_turns,
                "extra_fields": out.extra_fields,
                "tensors": {k: v.tolist() for k, v in tensors.items() if hasattr(v, "tolist")},
            }
        )
    return {
        "verl": verl.__version__,
        "transformers": transformers.__version__,
        "registry": _agent_loop_registry.get("rollmesh"),
        "samples": samples,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
