"""Built-in embedding kernels: ``fused`` (FBGEMM table-batched, optimizer fused into backward)
and ``dense`` (the unfused baseline: replicated tables, materialised gradients)."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.errors import ConfigError
from neo_core.kernels import EmbeddingKernel, SparseOptimizer
from neo_core.registry import Registry


def fused_kernel(
    optimizer: str = "rowwise_adagrad",
    learning_rate: float = 0.05,
    eps: float = 1e-8,
) -> EmbeddingKernel:
    """FBGEMM table-batched embeddings; backward fused with the sparse optimizer."""
    return EmbeddingKernel(
        name="fused",
        compute_kernel="fused",
        optimizer=SparseOptimizer.parse(optimizer),
        learning_rate=learning_rate,
        eps=eps,
    )


def dense_kernel(
    optimizer: str = "adagrad",
    learning_rate: float = 0.05,
    eps: float = 1e-8,
) -> EmbeddingKernel:
    """Unfused baseline: tables replicated (data parallel), gradients all-reduced, torch optimizer."""
    opt = SparseOptimizer.parse(optimizer)
    if opt is SparseOptimizer.ROWWISE_ADAGRAD:
        raise ConfigError(
            "kernel.optimizer=rowwise_adagrad exists only in the fused kernel; use kernel=fused "
            "or kernel.optimizer=adagrad."
        )
    return EmbeddingKernel(
        name="dense",
        compute_kernel="dense",
        optimizer=opt,
        learning_rate=learning_rate,
        eps=eps,
        data_parallel_only=True,
        fused_backward=False,
    )


@hookimpl
def neo_register_kernels(registry: Registry) -> None:
    registry.register("fused", fused_kernel)
    registry.register("dense", dense_kernel)
