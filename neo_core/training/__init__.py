"""Training: the ranks, the Lightning module and strategy, checkpoints, logs and charts."""

from __future__ import annotations

import os


def started_as_rank() -> bool:
    """Whether a launcher started this process as one rank of an outside group (torchrun, or a
    script setting ``RANK`` and ``WORLD_SIZE``), not as one of the recipe's own spawned ranks
    (``NEO_SPAWNED``): the recipe then runs as that rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "NEO_SPAWNED" not in os.environ


def dist_formed() -> bool:
    """Whether a process group is formed (torch.distributed available and initialised)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
