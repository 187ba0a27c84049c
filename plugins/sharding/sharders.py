"""TorchRec sharders that execute every Neo sharding type, on CPU as well as GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from neo_core.sharding import ShardingType

if TYPE_CHECKING:
    from neo_core.sharding import PlanningContext


class NeoEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollectionSharder`` that offers all seven sharding types on every device.

    TorchRec's sharder offers row-wise, table-row-wise and grid sharding only on CUDA; they
    run on CPU over gloo too. Kernels: dense for data-parallel tables, fused for the rest.
    """

    def __init__(
        self,
        fused_params: dict[str, Any] | None = None,
        qcomm_codecs_registry: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """All of :class:`ShardingType`, whatever the device."""
        return [t.value for t in ShardingType]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        """Dense for data-parallel tables (the only type it runs), fused (and GPU variants) otherwise."""
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        kernels = super().compute_kernels(sharding_type, compute_device_type)
        return kernels or [EmbeddingComputeKernel.FUSED.value]


def make_sharders(context: PlanningContext) -> list[Any]:
    """The sharders for ``context``: fused-optimizer params from the kernel, codecs from the compressor."""
    return [
        NeoEmbeddingBagCollectionSharder(
            fused_params=context.kernel.fused_params(),
            qcomm_codecs_registry=context.compressor.qcomm_codecs_registry(),
        )
    ]
