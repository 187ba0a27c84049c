"""Topology backends: the shape and speeds of the cluster a model is planned for.

A topology plugin's factory returns a :class:`Topology`. Bandwidths are bytes per second and
per device; memory capacities are bytes per device (host memory is the share of one rank).
Every figure may carry its source in ``sources`` (keyed by field; a ``calibration`` entry names
the file a measured topology's figures come from); figures that are assumptions rather than
measurements or published numbers are listed in ``assumed`` so reports can mark them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from neo_core.checks import as_whole, counted, is_number
from neo_core.errors import ConfigError

GiB = 1024**3
GB = 1e9
MIN_BW = 1e6  # bytes/s: a bandwidth under 1 MB/s is one given in GB/s by mistake
# bytes/s: over 1 PB/s, far beyond any memory or link (HBM3e gives a GPU about 5 TB/s), a
# figure in bytes/s given as GB/s or multiplied by GB twice
MAX_BW = 1e15
MIN_MEMORY = 2**20  # bytes: a device or host memory under 1 MiB is a slip of units (GiB given as bytes)


def gbps(bytes_per_s: float) -> str:
    """A bandwidth in GB/s to three figures, as the plan's own line gives it (0.25, 12.5, 2,039):
    rounded to 0.1 GB/s, a what-if of 0.25 GB/s read 0.2 and one of 0.004 read 0.0."""
    value = bytes_per_s / GB
    if value >= 999.5:  # 999.7 to three figures is 1e+03, and 1234.5 1.23e+03
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 1e-4 else f"{value:.1e}"


def assumed_note(name: str, compute_device: str) -> str:
    """The key to the '*' that marks a topology's assumed figures (:meth:`Topology.describe`, a
    plan's text), with how to measure them where Neo can: this machine's CPU ranks."""
    measure = "; `neo calibrate` measures this machine's" if name == "local" and compute_device == "cpu" else ""
    return f"(* assumed, not verified against a primary source{measure})"


@dataclass(frozen=True)
class Topology:
    """A homogeneous cluster: ``num_nodes`` nodes of ``devices_per_node`` ranks each."""

    name: str
    num_nodes: int
    devices_per_node: int
    compute_device: str  # "cuda" or "cpu"
    device_memory: int  # bytes per rank (HBM on GPUs, the rank's share of RAM on CPU)
    host_memory: int  # bytes per rank of host DDR usable for embeddings behind a cache
    device_memory_bw: float  # bytes/s, lookups from device memory
    host_memory_bw: float  # bytes/s, lookups from host memory
    host_to_device_bw: float  # bytes/s, PCIe / UVM traffic per device
    intra_node_bw: float  # bytes/s per device inside a node (NVLink/NVSwitch, or shared memory)
    # bytes/s per device across nodes: the scale-out NIC of each device, or, where a node's
    # devices share NICs, their bandwidth over the devices (one 100 GB/s NIC for 4 GPUs: 25 GB/s),
    # as all of them send at once in the all-to-alls the cost model charges
    inter_node_bw: float
    sources: dict[str, str] = field(default_factory=dict)
    assumed: tuple[str, ...] = ()
    emulated_from: str | None = None  # set when a large topology is emulated on fewer ranks
    # how to give the ranks more memory where more ranks add none (CPU ranks splitting one
    # machine's RAM); None: add ranks or memory
    memory_fix: str | None = None
    # the settings that size this cluster, for messages that say what to change: a field
    # ("num_nodes", "device_memory", "host_memory") -> (its config key, what one unit of that
    # key gives: ranks for num_nodes, bytes per rank for the memories)
    config_keys: dict[str, tuple[str, float]] = field(default_factory=dict)
    # the most a config key can be (a field as in ``config_keys`` -> its largest value), e.g.
    # 1 for the local topology's memory_fraction
    config_limits: dict[str, float] = field(default_factory=dict)
    # Optional calibrated figures (CPU topologies; see docs/cost_model.md, "CPU calibration"):
    collective_latency_s: float | None = None  # fixed seconds per collective; None: model default
    lookup_fwd_id_s: float = 0.0  # seconds per looked-up id beyond its bytes (forward)
    lookup_bwd_id_s: float = 0.0  # seconds per id beyond its bytes (fused backward + update)
    bucketize_id_s: float = 0.0  # seconds per id to split a row-wise table's ids by shard
    reduce_scatter_bw: float | None = None  # bytes/s a rank sends in a reduce-scatter (None: intra)
    all_gather_bw: float | None = None  # bytes/s a rank sends in an all-gather (None: intra)
    allreduce_bw: float | None = None  # bytes/s of an all-reduce, 2 S (L-1)/L per second (None: intra)
    # bytes/s of fp32 values a rank encodes into a compressed precision and decodes back (the
    # quantized-communication codec, run on the rank's own device); None: the cost model's default
    codec_bw: float | None = None
    # what a plan for this cluster should say of its figures (a calibration figure outside the
    # range a CPU gives, taken as given): the plan's notes, whichever planner made it
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("num_nodes", "devices_per_node"):
            value = getattr(self, key)
            whole = as_whole(value)
            if whole is None or whole < 1:
                raise ConfigError(f"topology.{key} must be a whole number, at least 1; got {value!r}.")
            object.__setattr__(self, key, whole)  # 2.0 is 2
        for key in (
            "device_memory",
            "host_memory",
            "device_memory_bw",
            "host_memory_bw",
            "host_to_device_bw",
            "intra_node_bw",
            "inter_node_bw",
        ):
            value = getattr(self, key)
            if not is_number(value) or not 0 < value < math.inf:
                raise ConfigError(f"topology.{key} must be a positive finite number, got {value!r}.")
            if key.endswith("_memory") and value < MIN_MEMORY:
                named = self.config_keys.get(key)
                if named is not None:  # set through the plugin's own key, in its unit
                    raise ConfigError(
                        f"topology {self.name!r}: {named[0]}={value / named[1]:.3g} gives {value:.0f} bytes of "
                        f"{key.replace('_', ' ')} per rank, under 1 MiB: no table fits; give it more."
                    )
                raise ConfigError(
                    f"topology {self.name!r}: {key}={value!r} bytes is under 1 MiB, surely a slip of units: "
                    "Topology's memories are bytes, so a figure in GiB is multiplied by neo_core.topology.GiB "
                    "(80 GiB is 80 * GiB)."
                )
            if key.endswith("_bw") and value < MIN_BW:
                raise ConfigError(
                    f"topology {self.name!r}: {key}={value!r} bytes/s is under 1 MB/s, surely a slip of units: "
                    "Topology's bandwidths are bytes per second, so a figure in GB/s is multiplied by "
                    "neo_core.topology.GB (25 GB/s is 25 * GB = 2.5e10)."
                )
            if key.endswith("_bw") and value > MAX_BW:
                raise ConfigError(
                    f"topology {self.name!r}: {key}={value!r} bytes/s is over 1 PB/s, faster than any memory or "
                    "link, surely a slip of units: Topology's bandwidths are bytes per second, a figure in GB/s "
                    "multiplied by neo_core.topology.GB once (25 GB/s is 25 * GB = 2.5e10)."
                )
        # calibrated figures: seconds per id or collective may be 0, bandwidths must be positive
        optional = {
            "collective_latency_s": 0.0, "lookup_fwd_id_s": 0.0, "lookup_bwd_id_s": 0.0,
            "bucketize_id_s": 0.0, "reduce_scatter_bw": None, "all_gather_bw": None, "allreduce_bw": None,
            "codec_bw": None,
        }
        for key, least in optional.items():
            value = getattr(self, key)
            if value is None:
                continue
            in_range = is_number(value) and value < math.inf and (value >= least if least is not None else value > 0)
            if not in_range:
                need = "0 or more" if least is not None else "positive"
                raise ConfigError(
                    f"topology.{key} must be a finite number, {need}, got {value!r} "
                    "(from the topology's settings or its calibration file)."
                )
        notes = self.notes
        if notes is None or isinstance(notes, (str, bytes)) or not hasattr(notes, "__iter__"):
            raise ConfigError(f"topology {self.name!r}: notes must be a tuple of texts, got {notes!r}.")
        notes = tuple(notes)  # a list or a generator given: kept as a tuple
        if not all(isinstance(n, str) for n in notes):
            raise ConfigError(f"topology {self.name!r}: notes must be a tuple of texts, got {notes!r}.")
        object.__setattr__(self, "notes", notes)
        if self.compute_device not in ("cpu", "cuda"):
            raise ConfigError(
                f"topology.compute_device must be 'cpu' or 'cuda', got {self.compute_device!r}."
            )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def replace(self, **changes: Any) -> Topology:
        if changes.keys() & {"num_nodes", "devices_per_node", "compute_device", "device_memory", "host_memory"}:
            # advice for the topology as its plugin made it
            changes.setdefault("memory_fix", None)
            changes.setdefault("config_keys", {})
            changes.setdefault("config_limits", {})
        return dataclasses.replace(self, **changes)

    def setting_for(self, what: str, need: float) -> str | None:
        """The setting that gives ``need``: ranks in all when ``what`` is "num_nodes", else bytes
        per rank of that memory; e.g. "topology.device_memory_gib=47.5 or more, now 40". None
        where the topology names no key for it."""
        if what not in self.config_keys:
            return None
        key, unit = self.config_keys[what]
        now = self.num_nodes if what == "num_nodes" else round(getattr(self, what) / unit, 3)
        return f"{key}={self.setting_value(what, need):g} or more, now {now:g}"

    def setting_value(self, what: str, need: float) -> float:
        """The value of ``what``'s config key that gives ``need`` (``setting_for``): whole
        nodes, or the key's unit (GiB, or a fraction of memory) to one decimal, rounded up."""
        unit = self.config_keys[what][1]
        if what == "num_nodes":
            return math.ceil(need / unit - 1e-9)
        return math.ceil(need / unit * 10 - 1e-9) / 10

    def with_setting(self, what: str, value: float) -> Topology:
        """This topology with ``what``'s config key set to ``value`` (as ``setting_value``
        gives it), e.g. to check by planning that a setting named in a message holds."""
        unit = self.config_keys[what][1]
        if what == "num_nodes":
            return self.replace(num_nodes=int(value), config_keys=self.config_keys, config_limits=self.config_limits)
        return self.replace(**{what: int(value * unit)}, config_keys=self.config_keys, config_limits=self.config_limits)

    def beyond_limit(self, what: str, need: float) -> str | None:
        """Where ``need`` asks more of ``what``'s config key than it can be (``config_limits``),
        what its largest value gives, e.g. "10.02 GiB a rank at most (topology.memory_fraction=1)";
        None where it can be set that high."""
        limit = self.config_limits.get(what)
        if limit is None or what not in self.config_keys or self.setting_value(what, need) <= limit:
            return None
        key, unit = self.config_keys[what]
        most = f"{limit * unit:,.0f} ranks" if what == "num_nodes" else f"{limit * unit / 2**30:.2f} GiB a rank"
        return f"{most} at most ({key}={limit:g})"

    def emulated_on(self, world_size: int, compute_device: str) -> Topology:
        """This topology's per-device memory and bandwidth model on ``world_size`` ranks.

        Used when the cluster described is larger than the machine at hand: nodes are kept
        as separate as the rank count allows (at least two nodes when there are two ranks), so
        inter-node effects remain part of the plan.
        """
        if world_size == self.world_size and compute_device == self.compute_device:
            return self
        nodes = min(self.num_nodes, world_size)
        while world_size % nodes:
            nodes -= 1
        return self.replace(
            num_nodes=nodes,
            devices_per_node=world_size // nodes,
            compute_device=compute_device,
            emulated_from=f"{self.name} ({self.num_nodes}x{self.devices_per_node})",
        )

    def to_torchrec(self) -> Any:
        """The equivalent TorchRec planner ``Topology`` (bandwidths in bytes/ms)."""
        import inspect

        from torchrec.distributed.planner.types import Topology as TorchRecTopology

        # TorchRec warns when a Topology is not made by its TopologyFactory, which fills figures
        # in from the hardware it detects; these are a cluster's stated (and checked) figures,
        # often of a cluster other than this machine, so they are passed as they are
        quiet = {"created_by_factory": True} if "created_by_factory" in inspect.signature(TorchRecTopology).parameters else {}
        return TorchRecTopology(
            **quiet,
            world_size=self.world_size,
            local_world_size=self.devices_per_node,
            compute_device=self.compute_device,
            hbm_cap=self.device_memory,
            # a CPU rank holds its tables in its memory, which Neo calls device memory: TorchRec's
            # planner fills ddr there, so it gets the same limit (else its plans fail Neo's check)
            ddr_cap=self.device_memory if self.compute_device == "cpu" else self.host_memory,
            hbm_mem_bw=self.device_memory_bw / 1000,
            ddr_mem_bw=self.host_memory_bw / 1000,
            hbm_to_ddr_mem_bw=self.host_to_device_bw / 1000,
            intra_host_bw=self.intra_node_bw / 1000,
            inter_host_bw=self.inter_node_bw / 1000,
        )

    def describe(self) -> str:
        """A short human-readable summary, marking assumed figures with '*'."""

        def mark(key: str) -> str:
            return "*" if key in self.assumed else ""

        lines = [
            f"topology {self.name}: {self.num_nodes} node(s) x {self.devices_per_node} "
            f"{self.compute_device} rank(s) = {counted(self.world_size, 'rank')}"
            + (f", emulating {self.emulated_from}" if self.emulated_from else ""),
            f"  memory/rank: device {self.device_memory / GiB:.1f} GiB{mark('device_memory')}, "
            f"host {self.host_memory / GiB:.1f} GiB{mark('host_memory')}",
            f"  bandwidth/rank: device mem {gbps(self.device_memory_bw)} GB/s"
            f"{mark('device_memory_bw')}, host mem {gbps(self.host_memory_bw)} GB/s"
            # GPUs read cached tables' missed rows over it (on CPUs host and device memory are one)
            + (f"{mark('host_memory_bw')}, host-to-device {gbps(self.host_to_device_bw)} GB/s"
               f"{mark('host_to_device_bw')}" if self.compute_device == "cuda" else f"{mark('host_memory_bw')}")
            + f", intra-node {gbps(self.intra_node_bw)} GB/s"
            f"{mark('intra_node_bw')}, inter-node {gbps(self.inter_node_bw)} GB/s"
            f"{mark('inter_node_bw')}",
        ]
        if "calibration" in self.sources:  # the file a local topology's measured figures come from
            lines.append(f"  calibration: {self.sources['calibration']}")
        if self.assumed:
            lines.append(f"  {assumed_note(self.name, self.compute_device)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # advice for messages (the notes are the plan's own), not figures of the cluster
        del d["memory_fix"], d["config_keys"], d["config_limits"], d["notes"]
        d["world_size"] = self.world_size
        d["assumed"] = list(self.assumed)
        return d

