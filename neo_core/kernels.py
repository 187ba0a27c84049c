"""Embedding kernels: how table lookups and their optimizer update are computed.

A kernel plugin's factory returns an :class:`EmbeddingKernel`, which tells TorchRec which
compute kernel to use and which fused-optimizer parameters to pass to FBGEMM, and tells the
planner how much optimizer state each row carries.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from neo_core.errors import ConfigError


class SparseOptimizer(str, enum.Enum):
    """Optimizers for embedding tables; values are the names users type."""

    SGD = "sgd"
    ROWWISE_ADAGRAD = "rowwise_adagrad"
    ADAGRAD = "adagrad"
    ADAM = "adam"

    @classmethod
    def parse(cls, value: str, key: str = "kernel.optimizer") -> SparseOptimizer:
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ConfigError(f"{key}={value!r} is not an optimizer; choose one of {choices}.") from None

    def state_floats(self, num_rows: int, dim: int) -> int:
        """Optimizer state (in fp32 values) for a table or shard of the given shape."""
        return {
            SparseOptimizer.SGD: 0,
            SparseOptimizer.ROWWISE_ADAGRAD: num_rows,
            SparseOptimizer.ADAGRAD: num_rows * dim,
            SparseOptimizer.ADAM: 2 * num_rows * dim,
        }[self]


@dataclass(frozen=True)
class EmbeddingKernel:
    """The compute kernel for embedding tables and its optimizer."""

    name: str
    compute_kernel: str  # TorchRec EmbeddingComputeKernel value: "fused" or "dense"
    optimizer: SparseOptimizer = SparseOptimizer.ROWWISE_ADAGRAD
    learning_rate: float = 0.05
    eps: float = 1e-8
    weight_bytes: int = 4  # bytes per stored embedding element
    data_parallel_only: bool = False  # the unfused kernel only runs replicated tables
    fused_backward: bool = True  # gradients applied inside backward, never materialised

    def __post_init__(self) -> None:
        """Kinds and ranges of the fields, each error naming its ``kernel.`` key."""
        from neo_core.checks import as_whole, is_number

        if isinstance(self.optimizer, str) and not isinstance(self.optimizer, SparseOptimizer):
            object.__setattr__(self, "optimizer", SparseOptimizer.parse(self.optimizer))
        if not isinstance(self.optimizer, SparseOptimizer):
            raise ConfigError(f"kernel.optimizer must be an optimizer name, got {self.optimizer!r}.")
        if self.compute_kernel not in ("fused", "dense"):
            raise ConfigError(
                f"kernel {self.name!r}: compute_kernel={self.compute_kernel!r} is not one of TorchRec's "
                "kernels Neo runs; choose fused or dense."
            )
        for key in ("learning_rate", "eps"):
            value = getattr(self, key)
            if not is_number(value) or not 0 < value < math.inf:
                raise ConfigError(f"kernel.{key} must be a positive finite number, got {value!r}.")
        if as_whole(self.weight_bytes) not in (1, 2, 4):
            raise ConfigError(
                f"kernel {self.name!r}: weight_bytes must be 4 (fp32), 2 (fp16) or 1 (int8), got {self.weight_bytes!r}."
            )
        object.__setattr__(self, "weight_bytes", int(self.weight_bytes))

    def fused_params(self) -> dict[str, Any]:
        """Parameters for TorchRec sharders (FBGEMM's fused optimizer settings)."""
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        optim = {
            SparseOptimizer.SGD: EmbOptimType.EXACT_SGD,
            SparseOptimizer.ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            SparseOptimizer.ADAGRAD: EmbOptimType.EXACT_ADAGRAD,
            SparseOptimizer.ADAM: EmbOptimType.ADAM,
        }[self.optimizer]
        params: dict[str, Any] = {"optimizer": optim, "learning_rate": self.learning_rate}
        if self.optimizer is not SparseOptimizer.SGD:
            params["eps"] = self.eps
        return params

    def optimizer_state_bytes(self, num_rows: int, dim: int) -> int:
        return 4 * self.optimizer.state_floats(num_rows, dim)

    @property
    def replica_optimizer(self) -> SparseOptimizer:
        """The optimizer of a data-parallel (replicated) table: ``torch.optim``'s, unfused, which
        has no row-wise Adagrad: such tables take full Adagrad, one fp32 state per element."""
        return SparseOptimizer.ADAGRAD if self.optimizer is SparseOptimizer.ROWWISE_ADAGRAD else self.optimizer

    def replica_state_bytes(self, num_rows: int, dim: int) -> int:
        """Optimizer state of one data-parallel replica (``replica_optimizer``), in bytes."""
        return 4 * self.replica_optimizer.state_floats(num_rows, dim)
