"""rollmesh_client.Client: one typed client per service, made on first use over that service's channel."""

from __future__ import annotations

import pytest

from rollmesh_client import Client
from rollmesh_client import GatewayClient
from rollmesh_client import RegistryClient
from rollmesh_client import SchedulerClient
from rollmesh_client import VerifierClient
from rollmesh_client import aio_channel

ADDRESSES = {s: f"127.0.0.1:{1 + i}" for i, s in enumerate(("registry", "verifier", "gateway", "scheduler"))}


async def test_each_service_attribute_is_its_typed_client_made_once() -> None:
    c = Client(ADDRESSES, api_key=None, timeout_s=5.0, retry_unavailable_s=2.0)
    try:
        kinds = {"registry": RegistryClient, "verifier": VerifierClient, "gateway": GatewayClient}
        for service, kind in {**kinds, "scheduler": SchedulerClient}.items():
            client = getattr(c, service)
            assert type(client) is kind and getattr(c, service) is client
            assert client.channel is c.channel(service)
            assert (client.timeout_s, client.retry_unavailable_s) == (5.0, 2.0)
    finally:
        await c.close()


def test_on_the_class_the_attribute_is_inspectable() -> None:
    assert Client.gateway is not None and "first use" in (type(Client.gateway).__doc__ or "")


@pytest.mark.parametrize(
    "address", ["127.0.0.1:99999", "http://127.0.0.1:50054", "localhost", ":50054", "h:0"]
)
def test_an_address_that_is_not_host_port_is_refused_before_dialling(address: str) -> None:
    """gRPC took "h:99999" as port 34463 (silently another service) and "http://h:1" as a name."""
    with pytest.raises(ValueError, match="is not host:port"):
        aio_channel(address)
