"""A GPU cluster of your own: its shape and every figure as you give them.

    recipes/plan.py +topology=cluster topology.label=a100_4x8 topology.num_nodes=4 \
        topology.devices_per_node=8 topology.device_memory_gib=40 topology.device_memory_bw_gbps=1555 \
        topology.intra_node_bw_gbps=300 topology.nics_per_node=1 topology.nic_gbit_s=200 \
        topology.host_memory_gib_per_node=1024

or the same keys in an option file of your own (``my_conf/topology/a100_4x8.yaml`` with
``name: cluster``, run with ``--config-dir my_conf topology=a100_4x8``). Unlike ``zionex``,
whose figures are the paper's cluster's with yours laid over them, nothing here is taken from
another cluster: a figure the plan needs and was not given is refused, naming it, and plans
name the cluster by its ``label``. The network is either each GPU's share
(``inter_node_bw_gbps``, GB/s) or the node's NICs as sold (``nics_per_node`` x ``nic_gbit_s``,
Gb/s each, shared by the node's GPUs). Two host figures only cached tables use may be left
out: they are then assumed (PCIe Gen4 x16 and 400 GB/s of host memory a node) and marked so.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from neo_core.checks import as_whole, is_number
from neo_core.errors import ConfigError
from neo_core.topology import GB, MAX_BW, MIN_BW, GiB, Topology
from neo_plugins.topology.zionex import FASTEST_NIC_GBPS, check_figures, doubt_network

# figures only cached tables use, and what is assumed where they are not given
ASSUMED = {
    "host_memory_bw_gbps_per_node": (400.0, "host memory of a node, 400 GB/s assumed (not given)"),
    "host_to_device_bw_gbps": (32.0, "PCIe Gen4 x16, 32 GB/s a GPU assumed (not given)"),
}
# a NIC's Gb/s as sold: 1 MB/s to 1 PB/s, the Topology's floor and ceiling, in bits
MIN_NIC_GBIT, MAX_NIC_GBIT = 8 * MIN_BW / GB, 8 * MAX_BW / GB
EXAMPLE = ("topology.num_nodes=4 topology.devices_per_node=8 topology.device_memory_gib=40 "
           "topology.device_memory_bw_gbps=1555 topology.intra_node_bw_gbps=300 topology.nics_per_node=1 "
           "topology.nic_gbit_s=200 topology.host_memory_gib_per_node=1024")


def cluster_topology(
    label: str = "cluster",
    num_nodes: int | None = None,
    devices_per_node: int | None = None,
    device_memory_gib: float | None = None,
    device_memory_bw_gbps: float | None = None,
    intra_node_bw_gbps: float | None = None,
    inter_node_bw_gbps: float | None = None,
    nics_per_node: int | None = None,
    nic_gbit_s: float | None = None,
    host_memory_gib_per_node: float | None = None,
    host_memory_bw_gbps_per_node: float | None = None,
    host_to_device_bw_gbps: float | None = None,
) -> Topology:
    """A GPU cluster of ``num_nodes`` x ``devices_per_node`` GPUs with the figures given
    (memory in GiB, bandwidths in GB/s, a NIC in Gb/s as sold), named ``label`` in plans."""
    if not isinstance(label, str) or not label.strip() or label.strip().lower() in ("local", "zionex"):
        raise ConfigError(f"topology.label must name your cluster (e.g. a100_4x8), not {label!r}: "
                          "'local' and 'zionex' are the built-in topologies' names.")
    required = {
        "num_nodes": num_nodes,
        "devices_per_node": devices_per_node,
        "device_memory_gib": device_memory_gib,
        "device_memory_bw_gbps": device_memory_bw_gbps,
        "intra_node_bw_gbps": intra_node_bw_gbps,
        "host_memory_gib_per_node": host_memory_gib_per_node,
    }
    nics = (nics_per_node, nic_gbit_s)
    if inter_node_bw_gbps is not None and any(v is not None for v in nics):
        raise ConfigError(f"topology cluster {label!r}: give the network once, either topology.inter_node_bw_gbps "
                          "(each GPU's share, GB/s) or topology.nics_per_node with topology.nic_gbit_s (a node's NICs, "
                          "Gb/s each), not both; to replace one an option file gives, set the other to null (e.g. "
                          "topology.inter_node_bw_gbps=25 topology.nics_per_node=null topology.nic_gbit_s=null).")
    missing = [k for k, v in required.items() if v is None]
    one_node = as_whole(num_nodes) == 1  # nothing crosses a network: it need not be given
    if inter_node_bw_gbps is None and any(v is None for v in nics) and not (one_node and not any(nics)):
        missing += ([k for k, v in zip(("nics_per_node", "nic_gbit_s"), nics) if v is None]
                    if any(v is not None for v in nics) else ["inter_node_bw_gbps (or nics_per_node and nic_gbit_s)"])
    if missing:
        raise ConfigError(f"topology cluster {label!r} needs {', '.join(f'topology.{k}' for k in missing)}: nothing is "
                          f"assumed for a cluster of your own. For example: {EXAMPLE}.")
    shape = {}
    for key, value in (("num_nodes", num_nodes), ("devices_per_node", devices_per_node), ("nics_per_node", nics_per_node)):
        if key == "nics_per_node" and value is None:
            continue
        whole = as_whole(value)
        if whole is None or whole < 1:
            raise ConfigError(f"topology.{key} must be a whole number, at least 1; got {value!r}.")
        shape[key] = whole
    per_node = shape["devices_per_node"]
    network_key = "inter_node_bw_gbps"
    if inter_node_bw_gbps is None and nic_gbit_s is None:  # one node: its links inside, which nothing crosses
        inter = float(intra_node_bw_gbps)  # type: ignore[arg-type]
        network = "not given: one node, nothing crosses a network (the intra-node figure stands in)"
    elif inter_node_bw_gbps is None:
        network_key = "nic_gbit_s"
        if not is_number(nic_gbit_s) or not 0 < nic_gbit_s < math.inf:
            raise ConfigError(f"topology.nic_gbit_s must be a positive number of Gb/s (a NIC as sold, e.g. 200), "
                              f"got {nic_gbit_s!r}.")
        if not MIN_NIC_GBIT <= nic_gbit_s <= MAX_NIC_GBIT:  # a slip of units, said in the unit typed
            raise ConfigError(f"topology.nic_gbit_s={nic_gbit_s:g} is a NIC's Gb/s (bits), from {MIN_NIC_GBIT:g} to "
                              f"{MAX_NIC_GBIT:g}: a 200 Gb/s NIC is nic_gbit_s=200.")
        if nic_gbit_s > FASTEST_NIC_GBPS * 8:
            print(f"warning: topology.nic_gbit_s={nic_gbit_s:g} Gb/s is faster than any NIC sold "
                  f"({FASTEST_NIC_GBPS * 8:g} Gb/s); it is one NIC's Gb/s, as sold.", file=sys.stderr)
        inter = shape["nics_per_node"] * nic_gbit_s / 8 / per_node  # bits to bytes, shared by the node's GPUs
        network = (f"given: topology.nics_per_node={shape['nics_per_node']} x topology.nic_gbit_s={nic_gbit_s:g} "
                   f"(Gb/s) over {per_node} GPU(s): {inter:g} GB/s a GPU")
    else:
        inter = inter_node_bw_gbps
        network = f"given: topology.inter_node_bw_gbps={inter_node_bw_gbps:g}"
    host_given = {"host_memory_bw_gbps_per_node": host_memory_bw_gbps_per_node,
                  "host_to_device_bw_gbps": host_to_device_bw_gbps}
    left_out = [k for k, v in host_given.items() if v is None]  # assumed, and marked so
    host = {k: ASSUMED[k][0] if v is None else v for k, v in host_given.items()}
    figures: dict[str, Any] = {k: v for k, v in required.items() if k not in shape} | host
    check_figures(figures | ({"inter_node_bw_gbps": inter} if network_key == "inter_node_bw_gbps" else {}))
    if inter_node_bw_gbps is not None:
        doubt_network(inter)
    assumed = {"host_memory_bw_gbps_per_node": "host_memory_bw", "host_to_device_bw_gbps": "host_to_device_bw"}
    given = {k: f"given: topology.{k}={v:g}" for k, v in figures.items()}
    return Topology(
        name=label.strip(),
        num_nodes=shape["num_nodes"],
        devices_per_node=per_node,
        compute_device="cuda",
        device_memory=int(figures["device_memory_gib"] * GiB),
        host_memory=int(figures["host_memory_gib_per_node"] * GiB / per_node),
        device_memory_bw=figures["device_memory_bw_gbps"] * GB,
        host_memory_bw=figures["host_memory_bw_gbps_per_node"] * GB / per_node,
        host_to_device_bw=figures["host_to_device_bw_gbps"] * GB,
        intra_node_bw=figures["intra_node_bw_gbps"] * GB,
        inter_node_bw=inter * GB,
        config_keys={
            "num_nodes": ("topology.num_nodes", per_node),
            "device_memory": ("topology.device_memory_gib", GiB),
            "host_memory": ("topology.host_memory_gib_per_node", GiB / per_node),
        },
        sources={
            "num_nodes": f"given: topology.num_nodes={shape['num_nodes']}",
            "devices_per_node": f"given: topology.devices_per_node={per_node}",
            "device_memory": given["device_memory_gib"],
            "device_memory_bw": given["device_memory_bw_gbps"],
            "intra_node_bw": given["intra_node_bw_gbps"],
            "inter_node_bw": network,
            "host_memory": given["host_memory_gib_per_node"],
        } | {field: ASSUMED[key][1] if key in left_out else given[key] for key, field in assumed.items()},
        assumed=tuple(field for key, field in assumed.items() if key in left_out),
    )
