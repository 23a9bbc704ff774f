"""Train with TRL on rollmesh rollouts (docs/training.md, "TRL").

`RollmeshRollouts` is GRPOTrainer's `rollout_func`: each batch runs as a rollmesh job on any
environment, and its token records come back as TRL's `prompt_ids`, `completion_ids`, `logprobs`
and `env_mask`; `environment_reward` offers the environment's verdict as a reward function. The
trainer's weights reach every replica through UpdateWeights. `RollmeshRolloutWorker` and
`RollmeshWeightTransfer` are AsyncGRPOTrainer's rollout worker and weight transfer. Needs `trl`
(the `trainers` extra).
"""

from rollmesh_client.trl._async import RollmeshRolloutWorker
from rollmesh_client.trl._async import RollmeshWeightTransfer
from rollmesh_client.trl._rollout_func import BatchRecord
from rollmesh_client.trl._rollout_func import RollmeshRollouts
from rollmesh_client.trl._rollout_func import environment_reward
from rollmesh_client.trl._samples import TrlSample
from rollmesh_client.trl._samples import failed_sample
from rollmesh_client.trl._samples import row_prompt
from rollmesh_client.trl._samples import trl_sample
from rollmesh_client.trl._weights import WeightPush
from rollmesh_client.trl._weights import WeightPusher

__all__ = [
    "BatchRecord",
    "RollmeshRolloutWorker",
    "RollmeshRollouts",
    "RollmeshWeightTransfer",
    "TrlSample",
    "WeightPush",
    "WeightPusher",
    "environment_reward",
    "failed_sample",
    "row_prompt",
    "trl_sample",
]
