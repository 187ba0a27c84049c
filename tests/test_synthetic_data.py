"""Synthetic data: deterministic, split across ranks exactly, with a learnable signal."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from neo_core.errors import ConfigError
from neo_plugins.data.synthetic import hot_rows, hot_share, synthetic, zipf_exponent


def test_same_seed_same_batches_and_other_seed_differs() -> None:
    a = synthetic(seed=3).global_batch("train", 5, 64)
    b = synthetic(seed=3).global_batch("train", 5, 64)
    c = synthetic(seed=4).global_batch("train", 5, 64)
    assert torch.equal(a.dense_features, b.dense_features)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert not torch.equal(a.dense_features, c.dense_features)


def test_rank_parts_concatenate_to_the_global_batch() -> None:
    data = synthetic(num_sparse=4)
    full = data.global_batch("train", 2, 3 * 16)
    parts = [data.rank_batch("train", 2, r, 3, 16) for r in range(3)]
    assert torch.equal(torch.cat([p.labels for p in parts]), full.labels)
    assert torch.equal(torch.cat([p.dense_features for p in parts]), full.dense_features)
    for key in data.feature_names():
        whole = full.sparse_features[key]
        assert torch.equal(torch.cat([p.sparse_features[key].values() for p in parts]), whole.values())
        assert torch.equal(torch.cat([p.sparse_features[key].lengths() for p in parts]), whole.lengths())


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_ranks_streams_are_one_runs_batches_split_between_them(split: str) -> None:
    # what each rank trains and validates on (the stream Lightning reads): together, step by
    # step, the batches of one rank at the global batch size; none of them the same as another's
    from neo_core.training.datasets import RankStream

    data = synthetic(num_sparse=2)
    whole = list(RankStream(data, split, 0, 1, 3 * 8, start_step=4, length=3))
    ranks = [list(RankStream(data, split, r, 3, 8, start_step=4, length=3)) for r in range(3)]
    assert len(whole) == 3 and all(len(r) == 3 for r in ranks)
    for step, full in enumerate(whole):
        parts = [r[step] for r in ranks]
        assert torch.equal(torch.cat([p.labels for p in parts]), full.labels)
        assert torch.equal(torch.cat([p.dense_features for p in parts]), full.dense_features)
        assert not torch.equal(parts[0].dense_features, parts[1].dense_features)
        for key in data.feature_names():
            assert torch.equal(torch.cat([p.sparse_features[key].values() for p in parts]),
                               full.sparse_features[key].values())


def test_ids_are_zipf_skewed_and_in_range() -> None:
    data = synthetic(num_sparse=1, rows=10_000, pooling=3)
    ids = data.global_batch("train", 0, 4096).sparse_features.values()
    assert int(ids.min()) >= 0 and int(ids.max()) < 10_000
    hot = (ids < 100).float().mean()  # the hottest 1% of rows
    assert hot > 0.4, float(hot)


def test_labels_follow_the_hidden_model() -> None:
    data = synthetic()
    batch = data.global_batch("val", 0, 8192)
    # the dense part of the hidden logit alone already ranks the labels well above chance
    score = batch.dense_features @ data.dense_weights
    assert float(binary_auroc(score, batch.labels.long())) > 0.65
    assert 0.2 < float(batch.labels.mean()) < 0.6


def test_bad_schema_is_rejected_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="data.rows"):
        synthetic(rows=[100, 0])
    with pytest.raises(ConfigError, match="data.num_sparse"):
        synthetic(num_sparse=0)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"seed": -1}, "data.seed must be a whole number, 0 or more, got -1."),
        ({"seed": 1.5}, "data.seed must be a whole number, 0 or more, got 1.5."),
        ({"num_dense": 2.5}, "data.num_dense must be a whole number >= 0, got 2.5."),
        ({"num_sparse": True}, "data.num_sparse must be a whole number, at least 1, got True."),
        ({"num_sparse": float("inf")}, "data.num_sparse must be a whole number, at least 1, got inf."),
        ({"zipf_alpha": float("inf")}, "data.zipf_alpha must be a positive finite number, got inf."),
        ({"zipf_alpha": float("nan")}, "data.zipf_alpha must be a positive finite number, got nan."),
        ({"dense_scale": float("nan")}, "data.dense_scale must be a finite number, got nan."),
        ({"bias": "high"}, "data.bias must be a finite number, got 'high'."),
    ],
)
def test_bad_numbers_are_rejected_naming_the_key(kwargs, said) -> None:
    with pytest.raises(ConfigError) as err:
        synthetic(**kwargs)
    assert str(err.value) == said


def test_whole_numbers_written_as_floats_give_the_same_data() -> None:
    exact, floats = synthetic(num_dense=3, num_sparse=4, seed=5), synthetic(num_dense=3.0, num_sparse=4e0, seed=5.0)
    assert floats.tables(8) == exact.tables(8)
    a, b = exact.global_batch("train", 0, 16), floats.global_batch("train", 0, 16)
    assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())


def test_a_table_set_of_ones_own_is_trained_as_listed(tmp_path) -> None:
    # a plan_model table set could be planned but not trained: training took data.rows and
    # data.pooling cycled over tables named t_cat_<i>, at the model's one dim
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from neo_core.training.run import train
    from tests.conftest import ROOT

    listed = [{"name": "user", "num_embeddings": 3000, "pooling_factor": 2.0, "hot_fraction": 0.5},
              {"name": "item", "num_embeddings": 500, "embedding_dim": 16}]
    data = synthetic(tables=listed)
    tables = data.tables(16)
    # the planner is told each table's share of lookups on its hottest 1% of rows: the declared one
    # (which user's ids are drawn to have), and for item the one its Zipf(data.zipf_alpha) ids have
    item_hot = _exact_hot_share(500, 1.1)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor, t.hot_fraction) for t in tables] == [
        ("user", 3000, 16, 2.0, 0.5), ("item", 500, 16, 1.0, pytest.approx(item_hot, abs=1e-9))]
    batch = data.global_batch("train", 0, 64)
    assert batch.sparse_features.keys() == ["user", "item"] == data.feature_names()
    assert int(batch.sparse_features["item"].values().max()) < 500
    assert data.tables(8)[0].embedding_dim == 8 and data.tables(8)[1].embedding_dim == 16  # its own dim is kept
    with pytest.raises(ConfigError, match=r"data.tables: tables\[0\] \('a'\) lacks num_embeddings"):
        synthetic(tables=[{"name": "a"}])
    # the same tables from a file (a CSV as a feature store writes it): the same data
    csv = tmp_path / "tables.csv"
    csv.write_text("name,num_embeddings,pooling_factor,hot_fraction,embedding_dim\nuser,3000,2,0.5,\nitem,500,,,16\n")
    from_file = synthetic(tables=str(csv))
    assert from_file.tables(16) == tables and from_file.feature_names() == data.feature_names()
    assert torch.equal(from_file.global_batch("train", 0, 64).sparse_features.values(),
                       batch.sparse_features.values())
    with pytest.raises(ConfigError, match=r"data.tables: table file .*tables.csv, line 3: num_embeddings 'x'"):
        csv.write_text("name,num_embeddings\nuser,3000\nitem,x\n")
        synthetic(tables=str(csv))
    # one feature a table: two made the model's input layout differ from the data's (a crash
    # in TorchRec's input distribution at the first step)
    with pytest.raises(ConfigError, match=r"data.tables\[0\] \('a'\) lists 2 features; synthetic data gives each "
                                          r"table one"):
        synthetic(tables=[{"name": "a", "num_embeddings": 9, "feature_names": ["f1", "f2"]}])
    with pytest.raises(ConfigError, match=r"data.tables gives the tables, which data.rows would also give; leave it "
                                          r"out"):  # it was silently ignored
        synthetic(tables=listed, rows=[10, 20])
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=smoke", "trainer.world_size=1", "trainer.max_steps=2",
                                          "trainer.val_batches=1", "trainer.progress_bar=false",
                                          "trainer.checkpoint=false", f"data.tables={listed}".replace("'", ""),
                                          f"output_dir={tmp_path}"])
    metrics = train(OmegaConf.to_container(cfg, resolve=True))
    assert metrics["steps"] == 2
    import json
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert sorted(t["name"] for t in plan["tables"]) == ["item", "user"]
    assert {t["name"]: t["spec"]["hot_fraction"] for t in plan["tables"]} == {
        "user": 0.5, "item": pytest.approx(item_hot, abs=1e-9)}


def _exact_hot_share(rows: int, exponent: float) -> float:
    """The share of the hottest ceil(1%) of rows when row i (from 1) has weight i ** -exponent, summed."""
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow(-exponent)
    return float(weights[: max(1, -(-rows // 100))].sum() / weights.sum())


def _measured_hot_shares(data, steps: int = 16, batch: int = 1024) -> dict[str, float]:
    """Each feature's share of drawn ids that fall on its table's hottest 1% of rows."""
    drawn: dict[str, list[torch.Tensor]] = {key: [] for key in data.feature_names()}
    for step in range(steps):
        features = data.global_batch("train", step, batch).sparse_features
        for key in drawn:
            drawn[key].append(features[key].values())
    return {key: float((torch.cat(ids) < hot_rows(n)).double().mean()) for (key, ids), n in zip(drawn.items(), data.rows)}


def test_a_table_files_bad_table_is_named_by_its_file_and_line(tmp_path) -> None:
    # data.tables=<file> named a table that the file's numbers read but TableSpec refused by its
    # place in the list (tables[1]), and one of two features as data.tables[0]: not the file's line
    csv = tmp_path / "tables.csv"
    csv.write_text("name,num_embeddings,hot_fraction\nuser,3000,0.5\nitem,500,0.005\n")
    with pytest.raises(ConfigError, match=r"data.tables: table file .*tables.csv, line 3: Table 'item' has "
                                          r"hot_fraction 0.005"):
        synthetic(tables=str(csv))
    csv.write_text("name,num_embeddings,feature_names\nuser,3000,a;b\n")
    with pytest.raises(ConfigError, match=r"data.tables: table file .*tables.csv, line 2 \('user'\) lists 2 features"):
        synthetic(tables=str(csv))
    csv.write_text("name,num_embeddings\nuser,3000\nuser,500\n")
    with pytest.raises(ConfigError, match=r"'user' is table file .*tables.csv, line 2, table file .*tables.csv, line 3"):
        synthetic(tables=str(csv))


def test_a_listed_tables_hot_fraction_shapes_its_ids() -> None:
    # every table's ids were Zipf(data.zipf_alpha) whatever it declared: a (0.9) measured 0.75,
    # b (0.3) 0.6, and the planner was told the declared shares
    listed = [{"name": "a", "num_embeddings": 100_000, "pooling_factor": 2.0, "hot_fraction": 0.9},
              {"name": "b", "num_embeddings": 5_000, "hot_fraction": 0.3},
              {"name": "c", "num_embeddings": 50, "pooling_factor": 3.0, "hot_fraction": 0.5},  # 1% of it: 1 row
              {"name": "d", "num_embeddings": 2_000}]
    data = synthetic(tables=listed)
    measured = _measured_hot_shares(data)
    for table, declared in (("a", 0.9), ("b", 0.3), ("c", 0.5)):
        assert abs(measured[table] - declared) < 0.02, (table, measured[table], declared)
    assert [t.hot_fraction for t in data.tables(8)][:3] == [0.9, 0.3, 0.5]
    # a table without one keeps data.zipf_alpha, and the others' exponents leave its ids as they were
    assert abs(measured["d"] - _exact_hot_share(2_000, 1.1)) < 0.02
    plain = synthetic(tables=[{k: v for k, v in t.items() if k != "hot_fraction"} for t in listed])
    ours, theirs = data.global_batch("train", 0, 256).sparse_features, plain.global_batch("train", 0, 256).sparse_features
    assert torch.equal(ours["d"].values(), theirs["d"].values())
    assert all(torch.equal(ours[k].lengths(), theirs[k].lengths()) for k in "abcd")
    assert not torch.equal(ours["a"].values(), theirs["a"].values())


def test_tables_give_the_planner_the_share_the_ids_have() -> None:
    # the default tables were planned with hot_fraction None (uniform access) while Zipf 1.1 ids
    # put 0.26-0.75 of the lookups on each table's hottest 1% of rows
    data = synthetic(num_sparse=8, zipf_alpha=1.1)
    tables = data.tables(8)
    exact = [_exact_hot_share(n, 1.1) for n in data.rows]
    assert [t.hot_fraction for t in tables] == [pytest.approx(h, abs=1e-9) for h in exact]
    measured = _measured_hot_shares(data, steps=8)
    for table, key in zip(tables, data.feature_names()):
        assert abs(measured[key] - table.hot_fraction) < 0.02, (table.name, measured[key], table.hot_fraction)
    # another exponent, another share; a table too large to build its ids' distribution is told its
    # share at once (the sum beyond its first rows in closed form), checked against Hurwitz's zeta
    assert synthetic(num_sparse=1, rows=40_000, zipf_alpha=0.7).tables(8)[0].hot_fraction == pytest.approx(
        _exact_hot_share(40_000, 0.7), abs=1e-9)
    mpmath = pytest.importorskip("mpmath")

    def power_sum(n: int, exponent: float) -> float:  # sum of i ** -exponent over i in 1..n
        return mpmath.harmonic(n) if exponent == 1.0 else mpmath.zeta(exponent) - mpmath.zeta(exponent, n + 1)

    for rows, exponent in ((10**12, 1.1), (10**9, 0.7), (3 * 10**7, 1.0)):
        share = float(power_sum(hot_rows(rows), exponent) / power_sum(rows, exponent))
        told = synthetic(num_sparse=1, rows=rows, zipf_alpha=exponent).tables(8)[0].hot_fraction
        assert told == pytest.approx(share, abs=1e-9), (rows, exponent)


def test_a_declared_share_at_or_below_uniform_gives_uniform_ids() -> None:
    # the hottest 1% of 5000 rows take 0.01 of uniform lookups, of 150 rows (2 rows) 0.0133
    data = synthetic(tables=[{"name": "a", "num_embeddings": 5_000, "pooling_factor": 2.0, "hot_fraction": 0.01},
                             {"name": "b", "num_embeddings": 150, "hot_fraction": 0.01}])
    drawn = [data.global_batch("train", step, 1024).sparse_features for step in range(8)]
    for key, rows in (("a", 5_000), ("b", 150)):
        ids = torch.cat([features[key].values() for features in drawn])
        assert abs(float((ids < rows // 2).double().mean()) - 0.5) < 0.02, key  # Zipf 1.1: 0.9 of them
        assert abs(float((ids < hot_rows(rows)).double().mean()) - hot_rows(rows) / rows) < 0.01, key
    assert data.exponents == [0.0, 0.0]
    assert [t.hot_fraction for t in data.tables(8)] == [0.01, 0.01]


@pytest.mark.parametrize(("rows", "share"), [(5_000, 0.3), (100_000, 0.9), (10**6, 0.99), (1_000, 0.999), (10**12, 0.5)])
def test_a_declared_shares_exponent_gives_that_share_exactly(rows, share) -> None:
    # the exponent solved for a table's hot_fraction puts that share on its hottest 1% of rows
    # to within rounding, steep ones (0.999 of 1000 rows' lookups on 10 rows: exponent 3.5) too:
    # the planner is told the declared share, so the ids must have it
    exponent = zipf_exponent(rows, share)
    assert hot_share(rows, exponent) == pytest.approx(share, abs=1e-9), (rows, share, exponent)
