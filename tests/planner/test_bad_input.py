"""Bad input and capacity errors: each message names the table, what is wrong and the fix."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from neo_core.api import plan_tables
from neo_core.cache import CachePolicy
from neo_core.errors import ConfigError, PlanningError
from neo_core.sharding import TableSpec
from neo_plugins.sharding.planner.tables import make_tables
from tests.planner import cluster


def shortfalls(message: str) -> list[float]:
    """The byte counts a capacity message reports as over or short."""
    return [float(b.replace(",", "")) for b in re.findall(r"(-?[\d,]+) bytes", message)]


def test_cached_huge_table_blames_host_memory_with_a_positive_shortfall():
    # 2e9 rows x 128 fp32: 120 GiB per rank even split 8 ways; a 1% cache fits the devices,
    # the 64 GiB of host memory per rank does not
    huge = TableSpec("huge", 2_000_000_000, 128, 1.0)
    with pytest.raises(PlanningError) as err:
        plan_tables([huge], cluster(), 256, cache=CachePolicy("lru", load_factor=0.01))
    msg = str(err.value)
    assert "'huge'" in msg and "2,000,000,000 rows" in msg
    assert "over the 64.00 GiB of host memory" in msg
    assert "of device memory usable" not in msg  # the device holds its cache share
    short = shortfalls(msg)
    assert len(short) == 1 and short[0] > 0
    assert "(-" not in msg
    assert "add ranks or host memory" in msg and "shrink the table" in msg


def test_uncached_huge_table_blames_device_memory_and_names_the_cache():
    huge = TableSpec("huge", 2_000_000_000, 128, 1.0)
    with pytest.raises(PlanningError) as err:
        plan_tables([huge], cluster(), 256)
    msg = str(err.value)
    assert "'huge'" in msg and "over the 13.60 GiB of device memory usable on each of 8 ranks" in msg
    assert "GiB of host memory" not in msg  # nothing of it lives in host memory
    assert all(b > 0 for b in shortfalls(msg)) and shortfalls(msg)
    assert "cache=lru cache.load_factor=" in msg


def test_device_short_message_names_the_fix():
    tables = [TableSpec(f"d{i}", 100_000_000, 128, 1.0) for i in range(4)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256)
    msg = str(err.value)
    assert msg.startswith("Device memory is short") and "d0" in msg
    assert "add ranks or device memory" in msg and "shrink the tables." in msg
    assert "cache (cache=lru cache.load_factor=0.05)" in msg
    # with a cache already on, the lever is its load factor
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, cache=CachePolicy("lru", load_factor=0.9))
    msg = str(err.value)
    assert msg.startswith("Device memory is short") and "lower the cache load_factor" in msg


def test_cpu_ranks_are_told_about_ram_not_device_memory():
    cpu = replace(cluster(), compute_device="cpu")
    tables = [TableSpec(f"d{i}", 100_000_000, 128, 1.0) for i in range(4)]
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cpu, 256)
    msg = str(err.value)
    assert msg.startswith("Memory is short") and "each CPU rank's share of RAM" in msg
    assert "device" not in msg and "cache" not in msg  # no device, and a cache has no effect on CPU
    with pytest.raises(PlanningError) as err:
        plan_tables([TableSpec("huge", 2_000_000_000, 128, 1.0)], cpu, 256)
    msg = str(err.value)
    assert "of memory (each CPU rank's share of RAM) usable on each of 8 ranks" in msg
    assert "device" not in msg and "add ranks or memory" in msg


def test_numpy_integers_are_accepted_as_plain_ints():
    spec = TableSpec("t", np.int64(10), np.int32(16))
    assert spec == TableSpec("t", 10, 16)
    assert type(spec.num_embeddings) is int and type(spec.embedding_dim) is int
    assert spec.num_parameters == 160


@pytest.mark.parametrize(
    ("rows", "dim", "field", "kind"),
    [
        (10.5, 16, "num_embeddings", "float"),
        ("10", 16, "num_embeddings", "str"),
        (True, 16, "num_embeddings", "bool"),
        (10, 16.0, "embedding_dim", "float"),
        (10, np.float64(16), "embedding_dim", "float64"),
    ],
)
def test_non_integral_sizes_are_rejected_naming_table_and_field(rows, dim, field, kind):
    with pytest.raises(ConfigError) as err:
        TableSpec("tbl", rows, dim)
    msg = str(err.value)
    assert "'tbl'" in msg and field in msg and f"of type {kind}" in msg
    assert "whole number" in msg
    assert "at least 1 row" not in msg


def test_zero_and_negative_sizes_keep_their_messages():
    with pytest.raises(ConfigError, match=r"'z' has 0 rows; a table needs at least 1 row"):
        TableSpec("z", np.int64(0), 16)
    with pytest.raises(ConfigError, match=r"'n' has embedding_dim -4; it must be a positive integer"):
        TableSpec("n", 10, np.int16(-4))


def test_host_reserve_is_kept_back_and_reported():
    # 8 cached tables of 400M x 16 fp32 (23.8 GiB weights + 1.5 GiB optimizer each, 202 GiB):
    # the 8 devices hold at most 108.8 GiB, so host memory must hold over 90 GiB; a 90% host
    # reserve leaves 51.2 GiB of the 8 x 64 GiB
    tables = [TableSpec(f"h{i}", 400_000_000, 16, 2.0) for i in range(8)]
    lru = CachePolicy("lru", load_factor=0.01)
    result = plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=0.5)
    cap = 64 * 2**30
    for r in result.ranks:
        if r.host_memory:
            assert r.host_memory["reserve"] == 0.5 * cap and r.host_memory_capacity == cap
            assert sum(r.host_memory.values()) <= cap
    assert any(r.host_memory for r in result.ranks)
    assert any("50% of host memory" in n for n in result.notes)
    with pytest.raises(PlanningError) as err:
        plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=0.9)
    msg = str(err.value)
    assert msg.startswith("Host memory is short") and "GiB usable:" in msg and "h0" in msg
    with pytest.raises(ConfigError, match=r"sharding.host_reserve_fraction=1.5 must lie in \[0, 1\)"):
        plan_tables(tables, cluster(), 256, cache=lru, host_reserve_fraction=1.5)


# --- table generators (recipes/plan.py's plan_model.params) ---------------------------------


@pytest.mark.parametrize(
    ("params", "fragments"),
    [
        ({"num_tabels": 10}, ("Unknown parameter 'num_tabels'", "Did you mean 'num_tables'?", "seed")),
        ({"num_tables": "abc"}, ("'num_tables'", "must be an integer, got 'abc'",)),
        ({"num_tables": 2.0}, ("'num_tables'", "must be an integer, got 2.0",)),
        ({"mean_pooling": "x"}, ("'mean_pooling'", "must be a number",)),
        ({"dims": 16}, ("'dims'", "must be a list",)),
    ],
    ids=["misspelled", "string-for-int", "float-for-int", "string-for-float", "scalar-for-list"],
)
def test_table_generator_parameters_are_checked_by_name_and_kind(params, fragments) -> None:
    with pytest.raises(ConfigError) as err:
        make_tables("production_like", **params)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_table_generator_accepts_its_parameters() -> None:
    tables = make_tables("production_like", num_tables=7, mean_pooling=3, dims=[16, 32], dim_weights=[1, 1],
                         total_parameters=None)
    assert len(tables) == 7 and {t.embedding_dim for t in tables} <= {16, 32}
