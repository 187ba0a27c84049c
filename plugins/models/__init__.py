"""Built-in models: TorchRec's DLRM (dot interaction) and DLRM-DCNv2 (cross network)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN

from neo_core import hookimpl
from neo_core.checks import as_whole
from neo_core.errors import ConfigError
from neo_core.models import ModelBuilder, embedding_bag_collection
from neo_core.registry import Registry
from neo_core.sharding import TableSpec


class _DLRMBuilder(ModelBuilder):
    def __init__(
        self,
        embedding_dim: int,
        dense_arch: Sequence[int],
        over_arch: Sequence[int],
    ) -> None:
        self.embedding_dim = int(embedding_dim)
        for key, sizes in (("dense_arch", dense_arch), ("over_arch", over_arch)):
            if isinstance(sizes, str) or not hasattr(sizes, "__iter__") or not all(
                (as_whole(x) or 0) >= 1 for x in sizes
            ):
                raise ConfigError(f"model.{key} must be a list of layer sizes of 1 or more, got {sizes!r}.")
        if len(over_arch) < 2:  # TorchRec's OverArch: hidden layers, then the logit
            raise ConfigError(f"model.over_arch needs at least two layers, e.g. [64, 1]; got {list(over_arch)}.")
        self.dense_arch = [int(x) for x in dense_arch]
        self.over_arch = [int(x) for x in over_arch]
        if self.embedding_dim < 1:
            raise ConfigError(f"model.embedding_dim must be positive, got {embedding_dim}.")
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise ConfigError(
                f"model.dense_arch must end with the embedding dim ({self.embedding_dim}), "
                f"got {self.dense_arch}; e.g. model.dense_arch=[{','.join(map(str, [*self.dense_arch[:-1], self.embedding_dim]))}]."
            )
        if not self.over_arch or self.over_arch[-1] != 1:
            raise ConfigError(f"model.over_arch must end with 1 (one logit), got {self.over_arch}.")

    def check(self, tables: Sequence[TableSpec], num_dense: int) -> None:
        dims = sorted({t.embedding_dim for t in tables})
        for t in tables:
            if t.embedding_dim != self.embedding_dim:
                if len(dims) == 1:  # one dim for all: the model's is the one to change
                    arch = ",".join(map(str, [*self.dense_arch[:-1], dims[0]]))
                    fix = (f"set model.embedding_dim={dims[0]} model.dense_arch=[{arch}] (the tables' dim), or give "
                           f"the tables embedding_dim {self.embedding_dim}")
                else:
                    fix = (f"give every table one dim (the tables have {', '.join(map(str, dims))}), and "
                           "model.embedding_dim that dim")
                raise ConfigError(
                    f"Table {t.name!r} has dim {t.embedding_dim} but {self.name} needs every table at "
                    f"model.embedding_dim={self.embedding_dim}; {fix}."
                )
        if num_dense < 1:
            raise ConfigError(
                f"{self.name} needs at least one dense feature, got {num_dense} (data.num_dense for the "
                "synthetic data)."
            )


class DLRMBuilder(_DLRMBuilder):
    """DLRM with dot-product interaction (TorchRec ``DLRM``)."""

    name = "dlrm"

    def build(self, tables: Sequence[TableSpec], num_dense: int, device: str = "meta") -> nn.Module:
        self.check(tables, num_dense)
        return DLRM(
            embedding_bag_collection=embedding_bag_collection(tables, device),
            dense_in_features=num_dense,
            dense_arch_layer_sizes=self.dense_arch,
            over_arch_layer_sizes=self.over_arch,
        )


class DCNv2Builder(_DLRMBuilder):
    """DLRM with a low-rank DCNv2 cross network (TorchRec ``DLRM_DCN``, the MLPerf v2 model)."""

    name = "dcnv2"

    def __init__(
        self,
        embedding_dim: int,
        dense_arch: Sequence[int],
        over_arch: Sequence[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
    ) -> None:
        super().__init__(embedding_dim, dense_arch, over_arch)
        for key, value in (("dcn_num_layers", dcn_num_layers), ("dcn_low_rank_dim", dcn_low_rank_dim)):
            if value < 1:
                raise ConfigError(f"model.{key} must be a positive whole number, got {value!r}.")
        self.dcn_num_layers = int(dcn_num_layers)
        self.dcn_low_rank_dim = int(dcn_low_rank_dim)

    def build(self, tables: Sequence[TableSpec], num_dense: int, device: str = "meta") -> nn.Module:
        self.check(tables, num_dense)
        return DLRM_DCN(
            embedding_bag_collection=embedding_bag_collection(tables, device),
            dense_in_features=num_dense,
            dense_arch_layer_sizes=self.dense_arch,
            over_arch_layer_sizes=self.over_arch,
            dcn_num_layers=self.dcn_num_layers,
            dcn_low_rank_dim=self.dcn_low_rank_dim,
        )


def dlrm(
    embedding_dim: int = 16,
    dense_arch: Sequence[int] = (64, 16),
    over_arch: Sequence[int] = (64, 32, 1),
) -> ModelBuilder:
    """DLRM (dot interaction), laptop-sized by default (MLPerf's: dim 128, dense 512-256-128, over 1024-1024-512-256-1)."""
    return DLRMBuilder(embedding_dim, dense_arch, over_arch)


def dcnv2(
    embedding_dim: int = 16,
    dense_arch: Sequence[int] = (64, 16),
    over_arch: Sequence[int] = (64, 32, 1),
    dcn_num_layers: int = 3,
    dcn_low_rank_dim: int = 32,
) -> ModelBuilder:
    """DLRM-DCNv2, laptop-sized by default (MLPerf's: dim 128, dense 512-256-128, over 1024-1024-512-256-1, DCN 3 x 512)."""
    return DCNv2Builder(embedding_dim, dense_arch, over_arch, dcn_num_layers, dcn_low_rank_dim)


@hookimpl
def neo_register_models(registry: Registry) -> None:
    registry.register("dlrm", dlrm)
    registry.register("dcnv2", dcnv2)
