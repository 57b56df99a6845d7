import os

import pytest

from drover_client import Client


@pytest.fixture
def endpoint() -> str:
    """The replica under test (a `drover dev` started with
    --step-latency-ms, so operations take a while)."""
    found = os.environ.get("DROVER_ENDPOINT")
    if not found:
        pytest.fail("DROVER_ENDPOINT names the replica under test")
    return found


@pytest.fixture
def client(endpoint):
    with Client(endpoint) as client:
        yield client
