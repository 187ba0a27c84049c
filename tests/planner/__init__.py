"""Planner tests; ``cluster`` is the GPU topology they share."""

from __future__ import annotations

from neo_core.topology import GiB, Topology

GB = 1e9


def cluster(nodes: int = 2, per_node: int = 4, mem_gib: float = 16.0, inter_gbps: float = 25.0) -> Topology:
    """``nodes`` x ``per_node`` GPUs of ``mem_gib`` each, 64 GiB host memory per rank."""
    return Topology(
        name="test",
        num_nodes=nodes,
        devices_per_node=per_node,
        compute_device="cuda",
        device_memory=int(mem_gib * GiB),
        host_memory=int(64 * GiB),
        device_memory_bw=1500 * GB,
        host_memory_bw=50 * GB,
        host_to_device_bw=32 * GB,
        intra_node_bw=300 * GB,
        inter_node_bw=inter_gbps * GB,
    )
