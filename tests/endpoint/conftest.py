from __future__ import annotations

import pytest

from .standin_server import Behaviour, StandInServer


@pytest.fixture
def standin():
    """standin(**behaviour) -> URL of a running stand-in server (stopped after the test)."""
    servers = []

    def start(**kwargs) -> str:
        server = StandInServer(Behaviour(**kwargs))
        servers.append(server)
        return server.__enter__()

    yield start
    for s in servers:
        s.__exit__(None, None, None)
