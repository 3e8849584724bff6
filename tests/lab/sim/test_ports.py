"""The simulated lab's API port is picked outside the kernel's ephemeral range, so no
client connection on the machine can be handed it before the engine binds it."""

from __future__ import annotations

import socket

from lab.sim.lab import LISTENER_LOW, _ephemeral_low, free_port


def test_the_api_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert LISTENER_LOW <= port < low
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))  # the engine's API server binds all addresses
