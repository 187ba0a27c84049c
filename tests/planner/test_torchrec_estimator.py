"""Neo's search over TorchRec's estimator: its predictions are TorchRec's own scores."""

from __future__ import annotations

import logging

import pytest

from neo_core.api import make_context
from neo_core.errors import ConfigError
from neo_plugins.sharding.planner import NeoPlanner
from neo_plugins.sharding.planner.tables import mlperf_dcnv2, production_like
from neo_plugins.sharding.planner.torchrec_score import score_plan, torchrec_plan_and_score


def zionex(world: int, global_batch: int = 65536):
    topo = {"name": "zionex", "num_nodes": max(1, world // 8), "devices_per_node": min(8, world)}
    return make_context(topo, global_batch // world)


def test_predicted_step_is_torchrecs_score_of_the_plan():
    tables = production_like(40, seed=2)
    ctx = zionex(16)
    planner = NeoPlanner(estimator="torchrec")
    result = planner.plan(tables, ctx)
    assert any("EmbeddingPerfEstimator" in n for n in result.notes)
    # the per-rank totals the search balanced are the ones TorchRec's perf model rates
    assert result.predicted_step_time * 1e3 == pytest.approx(score_plan(tables, result, ctx), rel=1e-9)
    assert planner.last_search is not None
    assert planner.last_search.lower_bound() <= result.predicted_step_time * (1 + 1e-9)


def test_beats_torchrecs_planner_under_its_estimator_on_mlperf():
    logging.disable(logging.WARNING)
    try:
        tables = mlperf_dcnv2()
        ctx = zionex(16)
        neo_ms = score_plan(tables, NeoPlanner(estimator="torchrec").plan(tables, ctx), ctx)
        tr = torchrec_plan_and_score(tables, ctx)
        tr_ms, bound_ms = tr["score_ms"], tr["bound_ms"]
    finally:
        logging.disable(logging.NOTSET)
    assert bound_ms <= neo_ms * (1 + 1e-9)
    assert neo_ms < 0.95 * tr_ms, (neo_ms, tr_ms)
    assert not tr["timed_out"] and tr["proposals"] > 0
    # the other way round: TorchRec's plan costed by Neo's model is slower than Neo's own plan
    own = NeoPlanner().plan(tables, ctx).predicted_step_time * 1e3
    assert own < tr["neo_model_step_ms"], (own, tr)


def test_unknown_estimator_is_named():
    with pytest.raises(ConfigError, match=r"sharding\.estimator='tr'.*neo, torchrec"):
        NeoPlanner(estimator="tr")


def test_torchrec_planner_time_limit_keeps_its_best_plan():
    logging.disable(logging.WARNING)
    try:
        tables = production_like(60, seed=1)
        ctx = zionex(8)
        tr = torchrec_plan_and_score(tables, ctx, timeout_s=1)
    finally:
        logging.disable(logging.NOTSET)
    # cut after a second, it still returns the best plan it had, scored by its own estimator
    assert tr["timed_out"] and tr["proposals"] >= 1
    assert tr["bound_ms"] <= tr["score_ms"] < float("inf")
