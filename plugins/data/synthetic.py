"""Synthetic Criteo-like data: Zipf-skewed ids, labels from a hidden ground-truth model.

Every sample has ``num_dense`` standard-normal dense features and one multi-hot feature per
table. A table's ids follow a Zipf law over its rows (hot rows at small ids): row ``i`` (from 1)
is drawn with weight ``i ** -s``. ``s`` is ``zipf_alpha``, or, for a listed table that gives a
``hot_fraction``, the exponent that puts that share of its lookups on its hottest 1% of rows
(``ceil(rows / 100)`` rows, at least one; a share at or below those rows' share of the table
gives uniform ids, ``s = 0``). ``tables()`` gives the planner each table's share of lookups on
its hottest 1% of rows, computed from its distribution (a listed table's own ``hot_fraction``
where it gives one). The label is Bernoulli(sigmoid(z)) with
``z = w·dense + sum_t mean_{ids in t}(effect_t[id]) * sparse_scale / sqrt(T) + bias``, where
the weights ``w`` and per-row effects are fixed by ``seed``. A model that learns the hot rows'
effects and the dense weights approaches the Bayes AUC, so the signal is learnable.

Global batch ``g`` of a split is generated from ``(seed, split, g)`` and its size ``B *
world_size``; rank ``r`` takes rows ``[r*B, (r+1)*B)``, so runs of one global batch size (2
ranks of 64, 1 of 128) see the same global batches; another size gives other batches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from neo_core.checks import as_whole, is_number
from neo_core.data import DataSource
from neo_core.errors import ConfigError
from neo_core.sharding import TableSpec

_SPLIT_OFFSET = {"train": 0, "val": 1_000_003}

# Criteo-like mix of table sizes and pooling factors, cycled over the tables.
DEFAULT_ROWS = (100_000, 40_000, 10_000, 5_000, 2_000, 1_000, 200, 50)
DEFAULT_POOLING = (1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 4.0, 2.0)


# Exact terms of a sum of i ** -s; beyond them the rest is summed with Euler-Maclaurin (its
# error is below float64's resolution), so a table of any size costs the same.
_EXACT_TERMS = 10_000
_MAX_EXPONENT = 128.0  # the hottest row takes all but 2 ** -128 of the lookups


def hot_rows(rows: int) -> int:
    """The hottest 1% of a table's rows: ``ceil(rows / 100)``, at least one row."""
    return max(1, -(-rows // 100))


def _power_sum(n: int, s: float, head: np.ndarray) -> float:
    """``sum(i ** -s for i in 1..n)``; ``head`` holds the cumulative sums of the first terms."""
    if n <= len(head):
        return float(head[n - 1])
    m = len(head)  # the terms m..n: integral, end corrections, Bernoulli terms B2 and B4
    c, log_ratio = 1.0 - s, math.log(n / m)
    integral = m**c * (math.expm1(c * log_ratio) / c if c != 0.0 else log_ratio)
    d1 = -s * (n ** (-s - 1) - m ** (-s - 1))
    d3 = -s * (s + 1) * (s + 2) * (n ** (-s - 3) - m ** (-s - 3))
    tail = integral + (m**-s + n**-s) / 2 + d1 / 12 - d3 / 720
    return float(head[m - 2]) + tail


def hot_share(rows: int, exponent: float) -> float:
    """The share of lookups on the hottest 1% of ``rows`` rows (``hot_rows``) when row ``i`` (from
    1) is drawn with weight ``i ** -exponent``: the ``hot_fraction`` of such a table's ids."""
    k = hot_rows(rows)
    if k >= rows:
        return 1.0
    head = np.cumsum(np.arange(1, min(rows, _EXACT_TERMS) + 1, dtype=np.float64) ** -float(exponent))
    share = _power_sum(k, exponent, head) / _power_sum(rows, exponent, head)
    return min(max(share, 0.01), 1.0)  # k / rows >= 0.01 and share >= k / rows: only rounding is clipped


def zipf_exponent(rows: int, hot_fraction: float) -> float:
    """The Zipf exponent that puts ``hot_fraction`` of ``rows`` rows' lookups on the hottest 1% of
    them (bisection; 0, uniform ids, for a share at or below those rows' share of the table)."""
    k = hot_rows(rows)
    if k >= rows or hot_fraction <= k / rows:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi < _MAX_EXPONENT and hot_share(rows, hi) < hot_fraction:
        lo, hi = hi, hi * 2
    for _ in range(64):
        mid = (lo + hi) / 2
        if hot_share(rows, mid) < hot_fraction:
            lo = mid
        else:
            hi = mid
    return hi


def _cycled(value: Any, n: int, key: str, cast: type) -> list[Any]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise ConfigError(f"data.{key} is empty; give a number or a list of numbers.")
    kind_ok = (lambda v: as_whole(v) is not None) if cast is int else is_number  # no 1.5 rows, no true
    if not all(kind_ok(v) for v in values):
        what = "whole numbers" if cast is int else "numbers"
        raise ConfigError(f"data.{key} must hold {what}, got {value!r}.")
    return [cast(values[i % len(values)]) for i in range(n)]


class SyntheticData(DataSource):
    """Deterministic synthetic recommendation data (see module docstring)."""

    name = "synthetic"

    def __init__(
        self,
        num_dense: int,
        rows: Sequence[int],
        pooling: Sequence[float],
        zipf_alpha: float,
        dense_scale: float,
        sparse_scale: float,
        bias: float,
        seed: int,
        specs: Sequence[TableSpec] = (),
        own_dims: Sequence[bool] = (),
    ) -> None:
        self._num_dense = num_dense
        self.rows = list(rows)
        self.pooling = list(pooling)
        self.specs = list(specs)  # tables of one's own (``data.tables``): names, dims, hot fractions
        self.own_dims = list(own_dims) or [True] * len(self.specs)  # False: the model's dim
        self.zipf_alpha = zipf_alpha
        # each table's Zipf exponent: a listed table's hot_fraction sets its own
        hot = [t.hot_fraction for t in self.specs] or [None] * len(self.rows)
        self.exponents = [zipf_alpha if h is None else zipf_exponent(n, h) for n, h in zip(self.rows, hot)]
        self.dense_scale = dense_scale
        self.sparse_scale = sparse_scale
        self.bias = bias
        self.seed = seed
        self._truth = torch.Generator().manual_seed(seed)
        self.dense_weights = torch.randn(num_dense, generator=self._truth) / math.sqrt(num_dense)
        # Per-row effects and id CDFs take memory proportional to the tables: built on first use,
        # so planning (which only needs ``tables()``) can reject a table too large for any rank.
        self._per_row: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def _per_row_truth(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-table row effects and Zipf CDFs (the same values whenever first built)."""
        if self._per_row is None:
            effects = [torch.randn(n, generator=self._truth) for n in self.rows]
            self._per_row = (effects, [self._zipf_cdf(n, s) for n, s in zip(self.rows, self.exponents)])
        return self._per_row

    @property
    def effects(self) -> list[torch.Tensor]:
        return self._per_row_truth()[0]

    @staticmethod
    def _zipf_cdf(n: int, exponent: float) -> torch.Tensor:
        weights = torch.arange(1, n + 1, dtype=torch.float64).pow(-exponent)
        cdf = torch.cumsum(weights, 0)
        return (cdf / cdf[-1]).to(torch.float32)

    @property
    def num_dense(self) -> int:
        return self._num_dense

    def feature_names(self) -> list[str]:
        if self.specs:
            return [t.feature_names[0] for t in self.specs]
        return [f"cat_{i}" for i in range(len(self.rows))]

    def tables(self, embedding_dim: int) -> list[TableSpec]:
        """The tables, each with the hot_fraction its ids have (a listed table's own, which its
        ids were drawn to match)."""
        if self.specs:  # as listed; a table without its own dim takes the model's
            return [dataclasses.replace(
                t, embedding_dim=t.embedding_dim if own else embedding_dim,
                hot_fraction=hot_share(t.num_embeddings, s) if t.hot_fraction is None else t.hot_fraction)
                for t, own, s in zip(self.specs, self.own_dims, self.exponents)]
        return [
            TableSpec(
                name=f"t_cat_{i}",
                num_embeddings=n,
                embedding_dim=embedding_dim,
                pooling_factor=p,
                feature_names=(f"cat_{i}",),
                hot_fraction=hot_share(n, s),
            )
            for i, (n, p, s) in enumerate(zip(self.rows, self.pooling, self.exponents))
        ]

    def global_batch(self, split: str, step: int, global_batch_size: int) -> Batch:
        """Global batch ``step`` of ``split`` (the same on every rank and world size)."""
        if split not in _SPLIT_OFFSET:
            raise ConfigError(f"Unknown split {split!r}; use 'train' or 'val'.")
        g = torch.Generator().manual_seed(self.seed * 7_919 + _SPLIT_OFFSET[split] + step * 104_729 + 1)
        n = global_batch_size
        dense = torch.randn(n, self._num_dense, generator=g)
        logit = dense @ self.dense_weights * self.dense_scale + self.bias
        lengths_all, values_all = [], []
        sparse_signal = torch.zeros(n)
        effects, cdfs = self._per_row_truth()
        for cdf, effect, pf in zip(cdfs, effects, self.pooling):
            extra = torch.poisson(torch.full((n,), max(pf - 1.0, 0.0)), generator=g)
            lengths = (1 + extra).to(torch.int64)
            ids = torch.searchsorted(cdf, torch.rand(int(lengths.sum()), generator=g))
            ids.clamp_(max=cdf.numel() - 1)
            sample = torch.repeat_interleave(torch.arange(n), lengths)
            sums = torch.zeros(n).index_add_(0, sample, effect[ids])
            sparse_signal += sums / lengths
            lengths_all.append(lengths)
            values_all.append(ids)
        logit += sparse_signal * self.sparse_scale / math.sqrt(len(self.rows))
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=self.feature_names(),
            values=torch.cat(values_all),
            lengths=torch.cat(lengths_all).to(torch.int32),
        )
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)

    def batches(
        self, split: str, rank: int, world_size: int, batch_size: int, start_step: int = 0
    ) -> Iterator[Batch]:
        step = start_step
        while True:
            yield self.rank_batch(split, step, rank, world_size, batch_size)
            step += 1

    def rank_batch(self, split: str, step: int, rank: int, world_size: int, batch_size: int) -> Batch:
        full = self.global_batch(split, step, batch_size * world_size)
        if world_size == 1:
            return full
        lo, hi = rank * batch_size, (rank + 1) * batch_size
        kjt = full.sparse_features
        per_key = kjt.to_dict()
        keys = list(per_key)
        lengths = [per_key[k].lengths()[lo:hi] for k in keys]
        values = []
        for k in keys:
            jt = per_key[k]
            offsets = jt.offsets()
            values.append(jt.values()[offsets[lo] : offsets[hi]])
        sparse = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        return Batch(
            dense_features=full.dense_features[lo:hi],
            sparse_features=sparse,
            labels=full.labels[lo:hi],
        )


def synthetic(
    num_dense: int = 13,
    num_sparse: int = 26,
    rows: Any = DEFAULT_ROWS,
    pooling: Any = DEFAULT_POOLING,
    zipf_alpha: float = 1.1,
    dense_scale: float = 1.5,
    sparse_scale: float = 3.0,
    bias: float = -0.5,
    seed: int = 0,
    tables: Any = None,
) -> SyntheticData:
    """Criteo-shaped synthetic data; ``rows`` and ``pooling`` are numbers or lists cycled over tables.
    ``tables``, a list of one's own tables (each a mapping of ``name``, ``num_embeddings`` and
    optionally ``pooling_factor``, ``embedding_dim``, ``hot_fraction``, as in a ``plan_model``
    file's ``listed`` table set) or a file of them (CSV, JSON or YAML, as ``generator: file``
    reads), replaces ``num_sparse``, ``rows`` and ``pooling``."""
    whole = {key: as_whole(value) for key, value in (("num_dense", num_dense), ("num_sparse", num_sparse), ("seed", seed))}
    if whole["num_dense"] is None or whole["num_dense"] < 0:
        raise ConfigError(f"data.num_dense must be a whole number >= 0, got {num_dense!r}.")
    if whole["num_sparse"] is None or whole["num_sparse"] < 1:
        raise ConfigError(f"data.num_sparse must be a whole number, at least 1, got {num_sparse!r}.")
    if whole["seed"] is None or whole["seed"] < 0:
        raise ConfigError(f"data.seed must be a whole number, 0 or more, got {seed!r}.")
    num_dense, num_sparse, seed = whole["num_dense"], whole["num_sparse"], whole["seed"]
    if not is_number(zipf_alpha) or not 0 < zipf_alpha < math.inf:
        raise ConfigError(f"data.zipf_alpha must be a positive finite number, got {zipf_alpha!r}.")
    for key, value in (("dense_scale", dense_scale), ("sparse_scale", sparse_scale), ("bias", bias)):
        if not is_number(value) or not math.isfinite(value):
            raise ConfigError(f"data.{key} must be a finite number, got {value!r}.")
    if tables is not None:
        given = [f"data.{key}" for key, value, default in (
            ("num_sparse", num_sparse, 26), ("rows", rows, DEFAULT_ROWS), ("pooling", pooling, DEFAULT_POOLING))
            if (list(value) if isinstance(value, (list, tuple)) else value)
            != (list(default) if isinstance(default, (list, tuple)) else default)]
        if given:  # they would be silently ignored
            raise ConfigError(f"data.tables gives the tables, which {', '.join(given)} would also give; leave "
                              f"{'it' if len(given) == 1 else 'them'} out (each table's rows and pooling_factor "
                              "go in its entry).")
        specs, own_dims = _listed_tables(tables)
        return SyntheticData(num_dense, [t.num_embeddings for t in specs], [t.pooling_factor for t in specs],
                             zipf_alpha, dense_scale, sparse_scale, bias, seed, specs, own_dims)
    row_list = _cycled(rows, num_sparse, "rows", int)
    pool_list = _cycled(pooling, num_sparse, "pooling", float)
    for i, n in enumerate(row_list):
        if n < 1:
            raise ConfigError(f"data.rows gives table t_cat_{i} {n} rows; every table needs at least 1.")
    for i, p in enumerate(pool_list):
        if p < 1:
            raise ConfigError(f"data.pooling gives table t_cat_{i} pooling {p}; it must be >= 1.")
    return SyntheticData(
        num_dense, row_list, pool_list, zipf_alpha, dense_scale, sparse_scale, bias, seed
    )


def _listed_tables(tables: Any) -> tuple[list[TableSpec], list[bool]]:
    """``data.tables`` as table specs, and whether each gave its own dim (one left out takes
    the model's: ``SyntheticData.tables``); each table's one feature is named after it."""
    from neo_plugins.sharding.planner.tables import _specs, listed, read_table_rows

    where_of = None  # a file's tables are named by the file and line (or entry) that gives them
    if isinstance(tables, str):  # a file of them: a CSV, JSON or YAML (plan_model's `generator: file`)
        try:
            tables, where_of = read_table_rows(tables)
        except ConfigError as exc:
            raise ConfigError(f"data.tables: {exc}") from None
    filled, own = [], []
    for n, item in enumerate(tables if isinstance(tables, (list, tuple)) else ()):
        item = dict(item) if isinstance(item, dict) else item
        if isinstance(item, dict):
            own.append("embedding_dim" in item)
            item.setdefault("embedding_dim", 4)  # a stand-in, replaced by the model's
            features = item.get("feature_names")
            if isinstance(features, (list, tuple)) and len(features) > 1:
                where = f"data.tables: {where_of(n)}" if where_of else f"data.tables[{n}]"
                raise ConfigError(
                    f"{where} ({item.get('name')!r}) lists {len(features)} features; synthetic data gives "
                    "each table one, named after it: leave feature_names out (or give one name)."
                )
            item.setdefault("feature_names", [str(item.get("name", f"t{n}"))])
        filled.append(item)
    try:
        if where_of is not None and isinstance(tables, (list, tuple)) and tables:
            return _specs(filled, where_of), own
        return listed(filled if isinstance(tables, (list, tuple)) else tables), own
    except ConfigError as exc:
        raise ConfigError(f"data.tables: {exc}") from None
