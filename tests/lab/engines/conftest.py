"""Nodes shaped like an eight-Spark lab inventory, for rendering launch specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.inventory import Node


def spark_nodes(count: int = 8, *, head: int = 0) -> list[Node]:
    """`count` nodes named spark-01.., node `head` (0-based) the head, data on 10.10.0.x."""
    return [
        Node(name=f"spark-{i + 1:02d}", host="127.0.0.1", port=40001 + i, user="root",
             key_file=Path("/keys/id_ed25519"), role="head" if i == head else "worker",
             mgmt_nic="enP7s7", data_nics=("enp1s0f0np0", "enP2p1s0f0np0"),
             data_addr=f"10.10.0.{i + 1}", model_dir="/models/kimi-k2",
             cache_dir=f"/var/cache/diag-{i + 1}", work_dir=f"/var/lib/diag-{i + 1}",
             api_port=8000, python="python3")
        for i in range(count)
    ]


@pytest.fixture
def sparks() -> list[Node]:
    return spark_nodes(8)
