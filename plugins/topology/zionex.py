"""ZionEX: 16 nodes x 8 GPUs with one scale-out RoCE NIC per GPU (Mudigere et al., ISCA'22).

Published: the node and GPU counts, one RDMA NIC per GPU on a dedicated scale-out network and
4 NICs for the CPUs (paper abstract, arXiv 2104.05158; InfoQ, May 2021). The GPU model, HBM
size and bandwidth, NVLink and NIC speeds and host memory were not verified against the paper
body: they are commonly reported values and are marked as assumed.
"""

from __future__ import annotations

import inspect
import math
import sys

from neo_core.checks import is_number
from neo_core.errors import ConfigError
from neo_core.topology import GB, MAX_BW, MIN_BW, GiB, Topology

FASTEST_NIC_GBPS = 100.0  # GB/s: an 800 Gb/s NIC, the fastest scale-out NIC sold today
PAPER = "Mudigere et al., ISCA'22 (arXiv 2104.05158), abstract"
INFOQ = "InfoQ, May 2021: ZionEX node = 4-socket CPUs, 8 GPUs, one RoCE NIC per GPU"


# each figure's setting and the Topology field it gives
FIELDS = {
    "device_memory_gib": "device_memory",
    "device_memory_bw_gbps": "device_memory_bw",
    "intra_node_bw_gbps": "intra_node_bw",
    "inter_node_bw_gbps": "inter_node_bw",
    "host_memory_gib_per_node": "host_memory",
    "host_memory_bw_gbps_per_node": "host_memory_bw",
    "host_to_device_bw_gbps": "host_to_device_bw",
}


def check_figures(given: dict[str, float]) -> None:
    """Refuse a figure in GiB or GB/s (``topology.<key>``, by the key named as typed) that is no
    positive number, or a bandwidth a slip of units made (under 1 MB/s or over 1 PB/s)."""
    for key, value in given.items():  # named as given: the figures are converted to bytes after
        unit = "GiB" if key.endswith(("_gib", "_gib_per_node")) else "GB/s"
        if not is_number(value) or not 0 < value < math.inf:
            raise ConfigError(f"topology.{key} must be a positive number of {unit}, got {value!r}.")
        if unit == "GB/s" and value * GB < MIN_BW:  # the Topology's floor, said in the unit typed
            raise ConfigError(f"topology.{key}={value!r} GB/s is under 1 MB/s (0.001 GB/s); give it in GB/s.")
        if unit == "GB/s" and value * GB > MAX_BW:  # and its ceiling: bytes/s typed where GB/s belongs
            raise ConfigError(f"topology.{key}={value!r} GB/s is over 1 PB/s (1,000,000 GB/s), faster than any "
                              f"memory or link: give it in GB/s ({value:g} bytes/s is {key}="
                              f"{value / GB:g}).")


def doubt_network(inter_node_bw_gbps: float) -> None:
    """Warn of a per-GPU network figure faster than any NIC: most often a NIC's Gb/s typed where
    GB/s belongs."""
    if inter_node_bw_gbps > FASTEST_NIC_GBPS:
        print(
            f"warning: topology.inter_node_bw_gbps={inter_node_bw_gbps:g} is GB/s (bytes) per rank, "
            f"{inter_node_bw_gbps * 8:,.0f} Gb/s: faster than any scale-out NIC; a NIC of "
            f"{inter_node_bw_gbps:g} Gb/s is inter_node_bw_gbps={inter_node_bw_gbps / 8:g}.",
            file=sys.stderr,
        )


def zionex_topology(
    num_nodes: int = 16,
    devices_per_node: int = 8,
    device_memory_gib: float = 40.0,
    host_memory_gib_per_node: float = 1536.0,
    device_memory_bw_gbps: float = 1555.0,
    host_memory_bw_gbps_per_node: float = 400.0,
    host_to_device_bw_gbps: float = 32.0,
    intra_node_bw_gbps: float = 300.0,
    inter_node_bw_gbps: float = 25.0,
) -> Topology:
    """ZionEX cluster (16 nodes x 8 A100, one 200 Gb/s RoCE NIC per GPU); bandwidths in GB/s."""
    if devices_per_node < 1:  # node figures are shared by its devices below
        raise ConfigError(f"topology.devices_per_node must be at least 1, got {devices_per_node}.")
    given = {
        "device_memory_gib": device_memory_gib,
        "host_memory_gib_per_node": host_memory_gib_per_node,
        "device_memory_bw_gbps": device_memory_bw_gbps,
        "host_memory_bw_gbps_per_node": host_memory_bw_gbps_per_node,
        "host_to_device_bw_gbps": host_to_device_bw_gbps,
        "intra_node_bw_gbps": intra_node_bw_gbps,
        "inter_node_bw_gbps": inter_node_bw_gbps,
    }
    check_figures(given)
    doubt_network(inter_node_bw_gbps)
    return Topology(
        name="zionex",
        num_nodes=num_nodes,
        devices_per_node=devices_per_node,
        compute_device="cuda",
        device_memory=int(device_memory_gib * GiB),
        host_memory=int(host_memory_gib_per_node * GiB / devices_per_node),
        device_memory_bw=device_memory_bw_gbps * GB,
        host_memory_bw=host_memory_bw_gbps_per_node * GB / devices_per_node,
        host_to_device_bw=host_to_device_bw_gbps * GB,
        intra_node_bw=intra_node_bw_gbps * GB,
        inter_node_bw=inter_node_bw_gbps * GB,
        config_keys={
            "num_nodes": ("topology.num_nodes", devices_per_node),
            "device_memory": ("topology.device_memory_gib", GiB),
            "host_memory": ("topology.host_memory_gib_per_node", GiB / devices_per_node),
        },
        sources={
            "num_nodes": PAPER + " (128 GPUs in 16 ZionEX nodes)",
            "devices_per_node": INFOQ,
            "inter_node_bw": "one scale-out NIC per GPU: " + INFOQ + "; 200 Gb/s per NIC assumed",
            "device_memory": "A100 40 GB assumed (commonly reported; not verified in the paper body)",
            "device_memory_bw": "A100 40 GB HBM2 1555 GB/s datasheet figure, assumed",
            "intra_node_bw": "NVLink 3, 300 GB/s per direction per GPU, assumed",
            "host_memory": "1.5 TiB DDR per node assumed",
            "host_memory_bw": "4 sockets x ~100 GB/s per node assumed",
            "host_to_device_bw": "PCIe Gen4 x16, 32 GB/s assumed (TorchRec's default is 32 GiB/s, 7% more)",
        } | {FIELDS[key]: f"given: topology.{key}={value:g}" for key, value in given.items() if value != DEFAULTS[key]}
        # the cluster's shape given other than ZionEX's is the user's too, not the paper's
        | {key: f"given: topology.{key}={value}" for key, value in (("num_nodes", num_nodes),
           ("devices_per_node", devices_per_node)) if value != DEFAULTS[key]},
        # a figure given other than the default is the user's, not an assumption (a what-if of
        # inter_node_bw_gbps=2.5 was marked "* assumed, not verified against a primary source")
        assumed=tuple(field for key, field in FIELDS.items() if given[key] == DEFAULTS[key]),
    )


DEFAULTS = {k: v.default for k, v in inspect.signature(zionex_topology).parameters.items()}
