"""The machine at hand: its CUDA devices, or a number of CPU ranks sharing its memory; or
several machines like it (``num_nodes``), as torchrun launches over them.

Bandwidths of CPU ranks come from a calibration file when one exists (``neo calibrate`` writes it;
``NEO_CALIBRATION`` or ``~/.cache/neo/calibration.json``), otherwise from conservative
defaults that are marked as assumed. The network between machines is measured by ``neo
calibrate`` run under torchrun on every machine; a figure measured on one machine (its ranks
talk through the loopback) is not taken for it.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from neo_core.checks import as_whole, is_number
from neo_core.errors import ConfigError
from neo_core.topology import GB, MAX_BW, MIN_BW, Topology, gbps

CALIBRATED_KEYS = (
    "device_memory_bw",
    "host_memory_bw",
    "host_to_device_bw",
    "intra_node_bw",
    "inter_node_bw",
)


# Optional CPU figures the cost model uses when present (seconds, or bytes/s for *_bw).
# written by `neo calibrate` for the record (the measurements behind the figures above), not read
CALIBRATION_RECORDS = (
    "torchrec_step_small_s",
    "torchrec_step_large_s",
    "gloo_latency_s",
    "lookup_rate_ids_per_s",
    "lookup_concurrency_slowdown",
    "measured_at",
    "ranks",
    # inter_node_bw measured between machines (``neo calibrate`` under a torchrun of several):
    # how many, with how many ranks each, and when; without these the file's inter_node_bw is
    # its ranks' loopback on one machine, not a network's
    "inter_node_machines",
    "inter_node_ranks_per_machine",
    "inter_node_measured_at",
    "inter_node_hosts",  # the distinct hosts it was measured on: fewer than the machines, a loopback's
)
CALIBRATED_EXTRAS = (
    "collective_latency_s",
    "lookup_fwd_id_s",
    "lookup_bwd_id_s",
    "bucketize_id_s",
    "reduce_scatter_bw",
    "all_gather_bw",
    "allreduce_bw",
    "codec_bw",
)

# Plausible ranges of the figures `neo calibrate` writes, for a CPU machine running gloo ranks; a
# figure outside one is a unit or formula slip (bytes vs bits, seconds vs milliseconds, a time
# where a rate belongs) or a measurement that a busy machine spoilt. One thread's memory
# traffic is 0.5 to 80 GB/s (a 2-core VM: 6-14 GB/s), so a figure in bits (8x) or per element
# instead of per byte (4x) of a typical machine falls outside.
_MEMORY = (5e8, 8e10)
_GLOO = (1e7, 1e11)  # collectives between local processes: 10 MB/s to 100 GB/s
_PER_ID = (0.0, 1e-5)  # seconds per id; fitted intercepts are clamped at zero on a noisy machine
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "device_memory_bw": _MEMORY,
    "host_memory_bw": _MEMORY,
    "host_to_device_bw": _MEMORY,
    "intra_node_bw": _GLOO,
    "inter_node_bw": _GLOO,
    "allreduce_bw": _GLOO,
    "codec_bw": (1e8, 1e11),  # fp32 bytes encoded and decoded a second: 2-5 GB/s on the 2-core VM
    "reduce_scatter_bw": _GLOO,
    "all_gather_bw": _GLOO,
    "lookup_fwd_id_s": _PER_ID,
    "lookup_bwd_id_s": _PER_ID,
    "bucketize_id_s": _PER_ID,
    "collective_latency_s": (0.0, 1.0),
    "gloo_latency_s": (1e-7, 1.0),
    "torchrec_step_small_s": (1e-5, 10.0),
    "torchrec_step_large_s": (1e-5, 10.0),
    "lookup_rate_ids_per_s": (1e5, 1e11),
    "lookup_concurrency_slowdown": (0.2, 50.0),
}


def _in_units(key: str, value: float) -> str:
    if key.endswith("_bw"):
        return f"{value / GB:.3g} GB/s"
    if key.endswith("_s"):
        return f"{value:.3g} s"
    return f"{value:.3g}" + (" ids/s" if key.endswith("_per_s") else "")


def implausible(data: dict[str, Any]) -> list[str]:
    """Figures of a calibration record that lie outside the ranges a CPU machine gives, each as
    ``key=value (plausible: low-high)``; numbers only (other entries are checked elsewhere)."""
    out = []
    for key, (low, high) in PLAUSIBLE.items():
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value:
            continue  # 0 or null: not measured
        if key.endswith("_bw") and not MIN_BW <= value <= MAX_BW:
            continue  # refused (as a slip of units, or as no memory's), which that error says: not warned of first
        if not low <= value <= high:
            out.append(f"{key}={_in_units(key, value)} (plausible: {_in_units(key, low)} to {_in_units(key, high)})")
    return out


def doubted(path: Path | str, odd: list[str]) -> str:
    """The warning of a calibration file's figures outside their plausible ranges (``odd``, as
    :func:`implausible` gives them); the plan's notes say it too (``Topology.notes``)."""
    return (f"calibration file {path}: {'; '.join(odd)}. Figures are bytes/s and seconds; re-run "
            "`neo calibrate` on an otherwise idle machine if these are not this machine's.")


def calibration_path() -> Path:
    env = os.environ.get("NEO_CALIBRATION")
    return Path(env) if env else Path.home() / ".cache" / "neo" / "calibration.json"


def load_calibration(path: Path | None = None, record: dict[str, Any] | None = None,
                     doubts: list[str] | None = None) -> dict[str, Any]:
    """Measured bandwidths (bytes/s) keyed by Topology field name; empty if never calibrated.
    ``record``, when given, receives the file's records (``ranks``, ``measured_at``...);
    ``doubts``, the warning it gives of figures outside their plausible ranges (for the plan's
    notes)."""
    if path is not None and not path.is_file():  # named by topology.calibration: must be there
        raise ConfigError(
            f"topology.calibration={str(path)!r} is not a file; run `neo calibrate --output {path}` "
            "or leave topology.calibration unset."
        )
    path = path or calibration_path()
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"Calibration file {path} is unreadable ({exc}); delete it or re-run `neo calibrate`.") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"Calibration file {path} holds a JSON {type(data).__name__}, not the object `neo calibrate` "
            "writes; delete it or re-run `neo calibrate`."
        )
    keep = CALIBRATED_KEYS + CALIBRATED_EXTRAS
    for key in (k for k in data if k not in keep and k not in CALIBRATION_RECORDS):
        close = difflib.get_close_matches(key, keep, n=1)
        if close:  # a typo of a figure the planner reads would leave the assumed one, silently
            raise ConfigError(
                f"Calibration file {path} has an unknown key {key!r}. Did you mean {close[0]!r}? The planner "
                f"reads {', '.join(keep)}; `neo calibrate` writes them."
            )
        # anything else (a note, a newer calibrate's record) is not read, and said so
        print(f"note: calibration file {path}: key {key!r} is not one the planner reads; ignored", file=sys.stderr)
    bad = [k for k, v in data.items() if k in keep and v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    if bad:
        raise ConfigError(
            f"Calibration file {path} has a non-numeric {bad[0]} ({data[bad[0]]!r}); re-run `neo calibrate`."
        )
    odd = implausible(data)
    if odd:  # planned with as given (the machine may be unusual), but not without a word
        print(f"warning: {doubted(path, odd)}", file=sys.stderr)
        if doubts is not None:
            doubts.append(doubted(path, odd))
    if record is not None:
        record.update({k: data[k] for k in CALIBRATION_RECORDS if k in data})
    # 0 or null: not measured (a fit clamped at zero), so the model's default stands
    return {k: float(v) for k, v in data.items() if k in keep and v}


def _calibration_source(record: dict[str, Any], ranks: int, calibration: str | None,
                        between: str | None = None) -> dict[str, str]:
    """The ``calibration`` entry of the topology's sources (its description prints it): which
    file, whether its collectives were measured with this topology's number of ranks (a
    machine's), and where its figure of the network is planned with, what that was measured
    ``between`` (None where the plan does not use it)."""
    if not record:
        return {}
    said = f"{calibration or calibration_path()}"
    if day := _day(record.get("measured_at")):
        said += f" ({day})"
    measured_with = record.get("ranks")
    if isinstance(measured_with, int) and not isinstance(measured_with, bool):
        said += f", collectives measured with {measured_with} ranks"
        if measured_with != ranks and ranks > 1:  # one rank runs no collectives
            fix = (f"`neo calibrate --ranks {ranks}` measures them for it" if ranks & (ranks - 1) == 0
                   else "`neo calibrate --ranks` measures them with a power of two ranks, the nearest is closest")
            said += f"; this topology has {ranks}: {fix} (the all-to-all and collective figures depend on it)"
    if between:
        said += f"; its network figure measured between {between}"
    return {"calibration": said}


def _day(when: Any) -> str | None:
    """A record's time (seconds since the epoch) as ``2026-12-07``; None where it is none, or a
    hand-edited value no date has."""
    if not (is_number(when) and when > 0):
        return None
    import time

    try:
        return time.strftime("%Y-%m-%d", time.localtime(when))
    except (OverflowError, OSError, ValueError):
        return None


def _between_machines(record: dict[str, Any]) -> str | None:
    """``2 machines of 4 ranks (2026-12-07)``: what a calibration file's ``inter_node_bw`` was
    measured between, where ``neo calibrate`` measured it across machines; None where it was
    one machine's loopback."""
    machines, each = record.get("inter_node_machines"), record.get("inter_node_ranks_per_machine")
    if not (isinstance(machines, int) and not isinstance(machines, bool) and machines >= 2):
        return None
    said = f"{machines} machines" + (f" of {each} rank(s)" if isinstance(each, int) and not isinstance(each, bool) else "")
    if day := _day(record.get("inter_node_measured_at")):
        said += f", {day}"
    return said


def _total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 * 1024**3


# The network between machines where nothing measured it, bytes/s a machine, shared by its ranks
# (they send at once in an all-to-all): a 10 Gb/s Ethernet for CPU machines, 100 Gb/s for CUDA
# ones; marked assumed, and never above the figure inside a machine
INTER_NODE_DEFAULT = {"cpu": 1.25 * GB, "cuda": 12.5 * GB}


def _check_network_figure(value: Any) -> None:
    """Refuse a ``topology.inter_node_bw_gbps`` that is no bandwidth or a slip of units (named
    as given, in GB/s), and warn of one faster than any NIC (a NIC's Gb/s typed as GB/s)."""
    from neo_core.registry import FASTEST_NIC

    if not (is_number(value) and 0 < value < math.inf):
        raise ConfigError(f"topology.inter_node_bw_gbps must be a positive number of GB/s (the network between "
                          f"machines, per rank), got {value!r}.")
    if value * GB < MIN_BW:
        raise ConfigError(f"topology.inter_node_bw_gbps={value!r} GB/s is under 1 MB/s (0.001 GB/s); give it in GB/s.")
    if value * GB > MAX_BW:
        raise ConfigError(f"topology.inter_node_bw_gbps={value!r} GB/s is over 1 PB/s (1,000,000 GB/s), faster than "
                          f"any link: give it in GB/s ({value:g} bytes/s is inter_node_bw_gbps={value / GB:g}).")
    if value * GB > FASTEST_NIC:
        print(f"warning: topology.inter_node_bw_gbps={value:g} is GB/s (bytes) per rank, {value * 8:,.0f} Gb/s: faster "
              f"than any network card; a network of {value:g} Gb/s is inter_node_bw_gbps={value / 8:g}.",
              file=sys.stderr)


def local_topology(
    world_size: int | None = None,
    compute_device: str | None = None,
    memory_fraction: float = 0.5,
    calibration: str | None = None,
    num_nodes: int | None = None,
    inter_node_bw_gbps: float | None = None,
) -> Topology:
    """This machine: every CUDA device, else ``world_size`` CPU ranks (default 2); or
    ``num_nodes`` machines like it, ``world_size`` ranks in all (default: that many per machine).
    The recipes and ``plan_model`` give ``num_nodes`` from the launch (torchrun's
    ``WORLD_SIZE`` over ``LOCAL_WORLD_SIZE``); ``recipes/plan.py topology.num_nodes=4`` plans
    for four machines like this one."""
    device = compute_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"topology.compute_device must be 'cpu' or 'cuda', got {device!r}.")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("topology.compute_device=cuda but no CUDA device is visible; use cpu.")
    if not 0 < memory_fraction <= 1:
        raise ConfigError(f"topology.memory_fraction must be in (0, 1], got {memory_fraction}.")
    nodes = 1 if num_nodes is None else as_whole(num_nodes)
    if nodes is None or nodes < 1:
        raise ConfigError(f"topology.num_nodes must be a whole number of machines, at least 1; got {num_nodes!r}.")
    if inter_node_bw_gbps is not None:
        _check_network_figure(inter_node_bw_gbps)
    ram = _total_ram()
    if device == "cuda" and calibration:
        raise ConfigError(
            "topology.calibration applies to CPU ranks only (it measures the CPU); leave it unset on "
            "CUDA devices, whose figures are the GPU defaults."
        )
    # calibration measures the CPU (FBGEMM's CPU kernel, gloo): not the GPUs
    record: dict[str, Any] = {}
    doubts: list[str] = []  # the warning of figures outside their plausible ranges, for the plan's notes
    measured = load_calibration(Path(calibration) if calibration else None, record, doubts) if device == "cpu" else {}
    if world_size is not None:
        whole = as_whole(world_size)
        if whole is None or whole < 1:
            raise ConfigError(f"topology.world_size must be at least 1, got {world_size!r}.")
        world_size = whole
    if world_size is not None and world_size % nodes:
        raise ConfigError(
            f"topology.world_size={world_size} rank(s) do not split evenly over topology.num_nodes={nodes} "
            f"machines: give a multiple of {nodes}, or leave topology.world_size unset for "
            f"{'every CUDA device' if device == 'cuda' else 2} rank(s) a machine."
        )
    if device == "cuda":
        count = torch.cuda.device_count()
        per_node = count if world_size is None else world_size // nodes
        if per_node > count:
            said = f"topology.world_size={world_size}" + (f" over {nodes} machines is {per_node} a machine," if nodes > 1 else "")
            raise ConfigError(f"{said} but only {count} CUDA device(s) are visible.")
        props = torch.cuda.get_device_properties(0)
        device_memory = int(props.total_memory * memory_fraction)
        per_fraction = float(props.total_memory)  # a rank's device memory at memory_fraction=1
        defaults = {
            "device_memory_bw": 1000 * GB,
            "host_memory_bw": 20 * GB,
            "host_to_device_bw": 25 * GB,
            "intra_node_bw": 100 * GB,
            "inter_node_bw": 10 * GB,
        }
    else:
        per_node = 2 if world_size is None else world_size // nodes
        device_memory = int(ram * memory_fraction / per_node)  # the ranks of a machine split its RAM
        per_fraction = ram / per_node
        defaults = {
            "device_memory_bw": 5 * GB,
            "host_memory_bw": 5 * GB,
            "host_to_device_bw": 5 * GB,
            "intra_node_bw": 1 * GB,
            "inter_node_bw": 1 * GB,
        }
    given: dict[str, str] = {}
    network = False  # the file's figure of the network between machines is planned with
    between = _between_machines(record) if nodes > 1 else None
    if nodes > 1:
        if inter_node_bw_gbps is not None:
            measured["inter_node_bw"] = inter_node_bw_gbps * GB
            given["inter_node_bw"] = f"given: topology.inter_node_bw_gbps={inter_node_bw_gbps:g}"
            doubts.append(f"inter_node_bw {gbps(inter_node_bw_gbps * GB)} GB/s a rank, the network between the "
                          f"{nodes} machines: {given['inter_node_bw']}.")
        elif "inter_node_bw" in measured and between:
            given["inter_node_bw"] = f"measured between {between} ({calibration or calibration_path()})"
            network = True
            doubts.append(f"inter_node_bw {gbps(measured['inter_node_bw'])} GB/s a rank, the network between the "
                          f"{nodes} machines: {given['inter_node_bw']}.")
            hosts = record.get("inter_node_hosts")
            if isinstance(hosts, int) and hosts < record.get("inter_node_machines", 0):
                doubts.append(f"inter_node_bw was measured on {hosts} host(s) standing for "
                              f"{record.get('inter_node_machines')} machines: their loopback, not a network's figure.")
            if record.get("inter_node_machines") != nodes:
                doubts.append(f"inter_node_bw was measured between {record.get('inter_node_machines')} machines, and "
                              f"this topology has {nodes}.")
            each = record.get("inter_node_ranks_per_machine")
            if isinstance(each, int) and each != per_node:  # a machine's ranks share its network
                doubts.append(
                    f"inter_node_bw was measured with {each} rank(s) a machine sending at once, and this topology has "
                    f"{per_node}: re-run `neo calibrate` by torchrun with --nproc-per-node={per_node} on every machine "
                    "for their share of the network."
                )
        else:  # one machine's loopback, or nothing: not the network's figure
            loopback = measured.pop("inter_node_bw", None)
            if loopback is not None:  # a hand-edited network figure there would be dropped silently
                doubts.append(
                    f"the calibration file's inter_node_bw ({gbps(loopback)} GB/s) is not planned with: the file does "
                    "not record it as measured between machines (inter_node_machines), so it is its ranks' loopback "
                    "on one machine; a network's figure of your own is topology.inter_node_bw_gbps."
                )
            inside = measured.get("intra_node_bw", defaults["intra_node_bw"])
            defaults["inter_node_bw"] = min(INTER_NODE_DEFAULT[device] / per_node, inside)
            capped = (", capped at intra_node_bw, the figure inside a machine"
                      if defaults["inter_node_bw"] < INTER_NODE_DEFAULT[device] / per_node else "")
            how = ("measure it with `neo calibrate` run by torchrun on every machine (docs/cost_model.md, \"Several "
                   "machines\"), or give topology.inter_node_bw_gbps" if device == "cpu" else
                   "give topology.inter_node_bw_gbps (the NICs' bandwidth over the GPUs that share them)")
            doubts.append(
                f"inter_node_bw, the network between the {nodes} machines, is assumed: "
                f"{gbps(defaults['inter_node_bw'])} GB/s a rank ({'10' if device == 'cpu' else '100'} Gb/s a machine "
                f"over its {per_node} rank(s){capped}); {how}."
            )
    elif inter_node_bw_gbps is not None:
        raise ConfigError(
            f"topology.inter_node_bw_gbps={inter_node_bw_gbps:g} is the network between machines, but this topology "
            "is one machine (topology.num_nodes=1, and no launch over several): leave it unset, or give "
            "topology.num_nodes."
        )
    figures = {**defaults, **measured}
    assumed = tuple(k for k in CALIBRATED_KEYS if k not in measured)
    source = f"measured ({calibration or calibration_path()})"
    bad = [k for k, v in measured.items() if k in CALIBRATED_KEYS and v < 0]
    if bad:
        raise ConfigError(
            f"Calibration file {calibration or calibration_path()} gives {bad[0]}={measured[bad[0]]}, "
            "a negative bandwidth; delete it or re-run `neo calibrate`."
        )
    # a figure written in GB/s: the file holds bytes/s (Topology would refuse it naming the field only)
    slips = [k for k, v in measured.items() if k.endswith("_bw") and 0 < v < MIN_BW]
    if slips:
        k = slips[0]
        raise ConfigError(
            f"Calibration file {calibration or calibration_path()} gives {k}={measured[k]!r}, under 1 MB/s: its "
            f"bandwidths are bytes/s (for {measured[k]:g} GB/s write {measured[k] * GB:.3g}); mend it, or re-run "
            "`neo calibrate`."
        )
    # over 1 PB/s: no memory's or link's (a fit of a busy machine's timings that came out flat);
    # Topology would refuse it as a slip of units, naming no file, and every run reads this one
    if slips := [k for k, v in measured.items() if k.endswith("_bw") and v > MAX_BW]:
        k = slips[0]
        raise ConfigError(
            f"Calibration file {calibration or calibration_path()} gives {k}={measured[k]:.3g} bytes/s, over 1 PB/s, "
            "which no memory or link gives (a measurement of a busy machine?): re-run `neo calibrate` on a quiet "
            "machine, or delete the file."
        )
    return Topology(
        name="local",
        num_nodes=nodes,
        devices_per_node=per_node,
        compute_device=device,
        device_memory=device_memory,
        host_memory=int(ram * memory_fraction / per_node),
        sources={**{k: source for k in measured}, **given, **_calibration_source(record, per_node, calibration, between if network else None)},
        assumed=assumed,
        memory_fix=None if device == "cuda" else (
            "add memory (the ranks share this machine's RAM, so more ranks add none; where "
            "topology.memory_fraction=1 is too little, use a machine with more RAM or several machines "
            "(topology.num_nodes, launched by torchrun on each), or dry-run the cluster you plan for: "
            "recipes/plan.py +topology=zionex)"),
        config_keys={"device_memory": ("topology.memory_fraction", per_fraction)},
        config_limits={"device_memory": 1.0},
        notes=tuple(doubts),
        **figures,
    )
