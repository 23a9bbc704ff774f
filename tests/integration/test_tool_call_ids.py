"""Every tool call the gateway answers has an id of its own, on every path: a capture's chat and
Responses calls (unary and streamed) under a job id longer than 8 characters, the plain OpenAI facade
(with and without x-request-id), and the gRPC Generate / GenerateStream / GenerateMany. Agent SDKs
(the OpenAI Agents SDK among them) key tool results by call id and fail on a repeated one; the
gateway once built the id from the request id's first 8 characters, which every request of a job
shares."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import GatewayModel
from rollmesh_client import Client
from tests.conftest import StartServer

# Two identical calls per turn: an SDK must be able to tell them apart by id alone.
TWO_CALLS = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>' * 2
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": False}
]
USER: list[Any] = [{"role": "user", "content": "add one, twice"}]
JOB = "a-job-id-longer-than-eight"


@dataclass
class Mesh:
    gateway: Gateway
    http: HttpFacade
    grpc_address: str
    client: Client


@pytest_asyncio.fixture
async def mesh(start_server: StartServer) -> AsyncIterator[Mesh]:
    gateway = Gateway([FakeBackend("tiny", script=lambda p, r: TWO_CALLS, max_model_len=2048)])
    await gateway.start()
    http = HttpFacade(gateway, host="127.0.0.1", port=0)
    await http.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    client = await Client.connect(gateway=server.address, timeout_s=10)
    try:
        yield Mesh(gateway, http, server.address, client)
    finally:
        await client.close()
        await http.stop()
        await gateway.shutdown()


async def _openai_ids(client: openai.AsyncOpenAI) -> list[str]:
    """Two calls on each of the four OpenAI paths: chat and Responses, unary and streamed."""
    ids: list[str] = []
    for _ in range(2):
        chat = await client.chat.completions.create(model="x", messages=USER, tools=CHAT_TOOLS)
        ids += [c.id for c in chat.choices[0].message.tool_calls or []]
        stream = await client.chat.completions.create(model="x", messages=USER, tools=CHAT_TOOLS, stream=True)
        async for chunk in stream:
            ids += [c.id for c in chunk.choices[0].delta.tool_calls or [] if c.id] if chunk.choices else []
        reply = await client.responses.create(model="x", input=USER, tools=RESPONSES_TOOLS)
        ids += [o.call_id for o in reply.output if o.type == "function_call"]
        async with client.responses.stream(model="x", input=USER, tools=RESPONSES_TOOLS) as helper:
            final = await helper.get_final_response()
        ids += [o.call_id for o in final.output if o.type == "function_call"]
    return ids


async def test_every_call_of_a_capture_and_of_the_facade_has_its_own_id(mesh: Mesh) -> None:
    ids: list[str] = []
    for rollout in range(2):  # two rollouts of one job: their request ids share a long prefix
        session = f"{JOB}/0/{rollout}"
        capture = mesh.gateway.captures.open(session, session_id=session)
        client = openai.AsyncOpenAI(
            base_url=mesh.gateway.captures.base_url(capture), api_key=capture.token, max_retries=0, timeout=30
        )
        try:
            ids += await _openai_ids(client)
        finally:
            await client.close()
            mesh.gateway.captures.close(session)
    for headers in ({}, {"x-request-id": f"{JOB}/plain"}, {"x-request-id": f"{JOB}/plain-2"}):
        client = openai.AsyncOpenAI(
            base_url=mesh.http.base_url, api_key="unused", max_retries=0, timeout=30, default_headers=headers
        )
        try:
            # the same x-request-id twice at once is refused, so one call per header here
            chat = await client.chat.completions.create(model="tiny", messages=USER, tools=CHAT_TOOLS)
            ids += [c.id for c in chat.choices[0].message.tool_calls or []]
        finally:
            await client.close()
    assert len(ids) == 2 * 2 * 4 * 2 + 3 * 2
    assert len(set(ids)) == len(ids), ids
    assert all(i.startswith("call_") for i in ids)


def _call(n: int) -> GenerateCall:
    return GenerateCall(
        model="",
        messages=USER,
        tools=[{"name": "add", "parameters": {"type": "object"}}],
        sampling={"max_tokens": 256},
        session_id="",
        request_id=f"{JOB}/1/0/{n}",
    )


async def test_every_call_over_grpc_has_its_own_id(mesh: Mesh) -> None:
    ids: list[str] = []
    for n in range(2):
        r = await mesh.client.gateway.generate(USER, tools=[{"name": "add"}], request_id=f"{JOB}/0/0/{n}")
        ids += [c.id for c in r.message.tool_calls]
        r = await mesh.client.gateway.generate(USER, tools=[{"name": "add"}])  # no request id
        ids += [c.id for c in r.message.tool_calls]
        items = [
            x
            async for x in mesh.client.gateway.generate_stream(
                USER, tools=[{"name": "add"}], request_id=f"{JOB}/s/{n}"
            )
        ]
        ids += [c.id for c in items[-1].final.message.tool_calls]
    model = GatewayModel.connect(mesh.grpc_address)  # GenerateMany, the scheduler's path
    try:
        turns = await asyncio.gather(*(model.generate(_call(n)) for n in range(3)))
    finally:
        await model.close()
    ids += [c["id"] for t in turns for c in t.message.get("tool_calls") or []]
    assert len(ids) == 2 * 3 * 2 + 3 * 2
    assert len(set(ids)) == len(ids), ids
