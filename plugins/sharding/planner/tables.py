"""Table sets for planning without a dataset: MLPerf DLRM-DCNv2, production-like, 12T ZionEX.

All generators are deterministic (a fixed numpy seed) and allocate no table memory.
"""

from __future__ import annotations

import difflib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from neo_core.checks import is_number
from neo_core.errors import ConfigError
from neo_core.registry import check_kind
from neo_core.sharding import TableSpec, check_table_names

# MLPerf DLRM-DCNv2, Criteo 1TB with the 40M cap (mlcommons/training recommendation_v2).
CRITEO_1TB_CAPPED = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)
MLPERF_MULTI_HOT = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


def mlperf_dcnv2(embedding_dim: int = 128) -> list[TableSpec]:
    """The 26 tables of MLPerf DLRM-DCNv2 (Criteo 1TB, 40M cap, its multi-hot sizes)."""
    return [
        TableSpec(f"cat_{i}", rows, embedding_dim, float(hot))
        for i, (rows, hot) in enumerate(zip(CRITEO_1TB_CAPPED, MLPERF_MULTI_HOT))
    ]


def production_like(
    num_tables: int = 500,
    seed: int = 0,
    min_rows: int = 100,
    max_rows: int = 10_000_000,
    dims: tuple[int, ...] = (16, 32, 64, 128, 256),
    dim_weights: tuple[float, ...] = (0.15, 0.3, 0.3, 0.2, 0.05),
    mean_pooling: float = 15.8,
    total_parameters: float | None = None,
) -> list[TableSpec]:
    """Heavy-tailed tables shaped like Meta's public DLRM embedding statistics.

    Row counts are log-uniform between ``min_rows`` and ``max_rows``; pooling factors are
    log-normal with mean ``mean_pooling`` (REFERENCE: 15.8) and a heavy tail; access skew
    (the share of lookups on the hottest 1% of rows) is uniform in [0.1, 0.9]. With
    ``total_parameters``, row counts are scaled so the model has about that many parameters.
    """
    if num_tables < 1:
        raise ConfigError(f"num_tables must be at least 1, got {num_tables}.")
    if not 1 <= min_rows <= max_rows:
        raise ConfigError(f"min_rows ({min_rows}) must be at least 1 and at most max_rows ({max_rows}).")
    def numbers_of(key: str, values: object) -> list[float]:
        if isinstance(values, str) or not hasattr(values, "__iter__"):
            raise ConfigError(f"{key} must be a list of numbers, got {values!r}.")
        out = list(values)  # type: ignore[call-overload]
        if not all(is_number(v) for v in out):
            raise ConfigError(f"{key} must be a list of numbers, got {out!r}.")
        return out

    dims, dim_weights = numbers_of("dims", dims), numbers_of("dim_weights", dim_weights)
    if not dims or len(dims) != len(dim_weights):
        raise ConfigError("dims and dim_weights must be non-empty lists of the same length.")
    if any(not float(d).is_integer() or d < 1 for d in dims):
        raise ConfigError(f"dims must be whole numbers of at least 1, got {dims}.")
    dims = [int(d) for d in dims]
    if any(w < 0 for w in dim_weights) or not sum(dim_weights) > 0:
        raise ConfigError(f"dim_weights must be numbers of 0 or more with a positive sum, got {dim_weights}.")
    if not 1.0 <= mean_pooling < float("inf"):
        raise ConfigError(f"mean_pooling must be a finite number of ids per sample, at least 1; got {mean_pooling}.")
    if total_parameters is not None and not (
        is_number(total_parameters) and 0 < total_parameters < float("inf")
    ):
        raise ConfigError(f"total_parameters must be a positive number (or null), got {total_parameters!r}.")
    rng = np.random.default_rng(seed)
    # exp(log(x)) can land a hair under x (500 -> 499.99999999999994, which int() made 499)
    rows = np.clip(np.exp(rng.uniform(np.log(min_rows), np.log(max_rows), num_tables)), min_rows, max_rows)
    sigma = 1.0
    pooling = rng.lognormal(np.log(mean_pooling) - sigma**2 / 2, sigma, num_tables)
    pooling = np.clip(pooling, 1.0, 500.0)
    w = np.asarray(dim_weights, dtype=np.float64)
    dim = rng.choice(np.asarray(dims), size=num_tables, p=w / w.sum())
    hot = rng.uniform(0.1, 0.9, num_tables)
    if total_parameters:
        rows = rows * total_parameters / float((rows * dim).sum())
    return [
        TableSpec(
            f"t{i:04d}",
            max(1, int(rows[i])),
            int(dim[i]),
            round(float(pooling[i]), 2),
            hot_fraction=round(float(hot[i]), 3),
        )
        for i in range(num_tables)
    ]


def zionex_12t(num_tables: int = 800, seed: int = 1) -> list[TableSpec]:
    """About 12 trillion embedding parameters (the Neo paper's largest model), production-like."""
    return production_like(
        num_tables=num_tables,
        seed=seed,
        min_rows=10_000,
        max_rows=10_000_000_000,
        dims=(64, 128, 256, 512),
        dim_weights=(0.2, 0.4, 0.3, 0.1),
        total_parameters=12e12,
    )


def listed(tables: list | None = None) -> list[TableSpec]:  # type: ignore[type-arg]
    """Your own tables, as listed: each a mapping of ``TableSpec``'s fields (``name``,
    ``num_embeddings``, ``embedding_dim``, ``pooling_factor``, ``hot_fraction``,
    ``feature_names``), e.g. in a ``plan_model`` file of a ``--config-dir``."""
    example = "[{name: user_id, num_embeddings: 10000000, embedding_dim: 128, pooling_factor: 1.0}, ...]"
    if isinstance(tables, (list, tuple)) and not tables:
        raise ConfigError(f"tables is empty: list at least one table, each a mapping of its fields, e.g. tables: {example}.")
    if isinstance(tables, (str, bytes)) or not isinstance(tables, (list, tuple)):
        raise ConfigError(f"tables must be a list of tables, each a mapping of its fields, e.g. tables: {example}; "
                          f"got {tables!r}; a file of them is `generator: file` with params.path.")
    return _specs(tables, lambda n: f"tables[{n}]")


TABLE_FIELDS = tuple(inspect.signature(TableSpec).parameters)


def table_file(path: str | None = None) -> list[TableSpec]:
    """Your own tables from a file (``path``): a CSV whose header names ``TableSpec``'s fields
    (``name``, ``num_embeddings``, ``embedding_dim``, and any of ``pooling_factor``,
    ``hot_fraction``, ``feature_names``: several separated by ``;``; an empty cell leaves a field
    out), or a JSON or YAML list of mappings of them (a feature store's dump, as it is)."""
    return _specs(*read_table_rows(path))


def read_table_rows(path: str | None) -> tuple[list[dict[str, object]], Callable[[int], str]]:
    """A table file's tables, each a mapping of its fields with numbers read as numbers, and
    how to name the n-th in a message (the file and its line)."""
    import csv
    import json

    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"a table file's path must be given (params.path, or data.tables=<file>), got {path!r}.")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"table file {path!r} is not a file (relative paths are from where the command runs: "
                          f"{Path.cwd()}).")
    suffix = file.suffix.lower()
    try:
        text = file.read_text(encoding="utf-8-sig")  # a spreadsheet's UTF-8 export starts with a byte-order mark
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"table file {path}: cannot be read ({exc}).") from None
    if suffix == ".csv":
        lines_of = text.splitlines()
        try:  # a dump's own separator: ',', ';', a tab or '|'
            dialect: Any = csv.Sniffer().sniff(lines_of[0] if lines_of else "", delimiters=",;\t|")
        except csv.Error:
            dialect = csv.excel
        reader = csv.DictReader(lines_of, dialect=dialect)
        header = [h.strip() for h in reader.fieldnames or []]
        other = []
        for column in header:
            if column not in TABLE_FIELDS:
                close = difflib.get_close_matches(column, TABLE_FIELDS, n=1, cutoff=0.75)
                if close:  # a misspelt field would be left out silently
                    raise ConfigError(f"table file {path}: column {column!r} is not a table's field. Did you mean "
                                      f"{close[0]!r}? A table's fields: {', '.join(TABLE_FIELDS)} (the first three "
                                      "needed).")
                other.append(column)
        if other:  # a feature store's own columns (an owner, a team): read past
            print(f"note: table file {path}: column(s) {', '.join(map(repr, other))} are not a table's fields "
                  f"({', '.join(TABLE_FIELDS)}); left out", file=sys.stderr)
        rows: list[dict[str, object]] = []
        lines: list[int] = []
        for row in reader:
            if None in row and any(str(v).strip() for v in row[None]):  # csv's key for cells past the header's
                quote = (" (a feature_names cell of several, separated by ';', is quoted in a ';'-separated file)"
                         if dialect.delimiter == ";" and "feature_names" in header else "")
                raise ConfigError(f"table file {path}, line {reader.line_num}: {len(header) + len(row[None])} cells "
                                  f"where the header has {len(header)}{quote}.")
            cells = {k.strip(): (v or "").strip() for k, v in row.items()
                     if k is not None and k.strip() not in other}
            if not any(cells.values()):
                continue  # a blank line
            lines.append(reader.line_num)
            rows.append({k: _cell(path, reader.line_num, k, v) for k, v in cells.items() if v})
        if not rows:
            raise ConfigError(f"table file {path}: no tables in it" + (" (a header alone)" if header else "") + ".")
        return rows, lambda n: f"table file {path}, line {lines[n]}"
    if suffix in (".json", ".yaml", ".yml"):
        import yaml

        try:
            data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:  # both say where
            raise ConfigError(f"table file {path}: not {suffix[1:].upper()} ({exc}).") from None
        if isinstance(data, dict) and "tables" in data:
            data = data["tables"]
        if not isinstance(data, list) or not data:
            raise ConfigError(f"table file {path}: give a list of tables, each a mapping of its fields "
                              f"({', '.join(TABLE_FIELDS)}), or a mapping whose 'tables' is one.")
        return data, lambda n: f"table file {path}, table {n + 1}"
    raise ConfigError(f"table file {path}: a .csv, .json, .yaml or .yml file is read, not {suffix or 'one without a suffix'}.")


def _cell(path: str, line: int, field: str, value: str) -> object:
    """A CSV cell as its field's value: a number for the numeric fields, a tuple of names
    (``a;b``) for ``feature_names``, else the text."""
    if field == "feature_names":
        return tuple(n.strip() for n in value.split(";") if n.strip())
    if field in ("num_embeddings", "embedding_dim", "pooling_factor", "hot_fraction"):
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            raise ConfigError(f"table file {path}, line {line}: {field} {value!r} is not a number.") from None
        return int(number) if field in ("num_embeddings", "embedding_dim") and number.is_integer() else number
    return value


def _specs(tables: list | tuple, where_of: Callable[[int], str]) -> list[TableSpec]:  # type: ignore[type-arg]
    """Table specs of mappings of their fields, a message naming the n-th by ``where_of(n)``."""
    fields = list(TABLE_FIELDS)
    required = [n for n, p in inspect.signature(TableSpec).parameters.items() if p.default is inspect.Parameter.empty]
    out = []
    for n, item in enumerate(tables):
        where = where_of(n) + (f" ({item.get('name')!r})" if isinstance(item, dict) and "name" in item else "")
        if not isinstance(item, dict):
            raise ConfigError(f"{where} must be a mapping of a table's fields ({', '.join(fields)}), got {item!r}.")
        for key in item:
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{where} has an unknown field {key!r}.{hint} A table's fields: {', '.join(fields)}.")
        missing = [f for f in required if f not in item]
        if missing:
            raise ConfigError(f"{where} lacks {', '.join(missing)}; a table needs {', '.join(required)}.")
        spec = dict(item)
        if isinstance(spec.get("feature_names"), list):
            spec["feature_names"] = tuple(spec["feature_names"])
        try:
            out.append(TableSpec(**spec))  # its own checks name the table and the field
        except ConfigError as exc:
            raise ConfigError(f"{where_of(n)}: {exc}") from None
    check_table_names(out, where_of)  # here, so that a recipe's message says where the list was given
    return out


GENERATORS = {"mlperf_dcnv2": mlperf_dcnv2, "production_like": production_like, "zionex_12t": zionex_12t,
              "listed": listed, "file": table_file}


def make_tables(generator: str, **params: object) -> list[TableSpec]:
    """Tables from the generator named ``generator`` (see ``GENERATORS``)."""
    if generator not in GENERATORS:
        raise ConfigError(
            f"Unknown table generator {generator!r}; choose one of {', '.join(sorted(GENERATORS))}."
        )
    func = GENERATORS[generator]
    signature = inspect.signature(func).parameters
    known = list(signature)
    for key, value in list(params.items()):
        if key not in signature:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"Unknown parameter {key!r} of table generator {generator!r}.{hint} "
                f"Its parameters: {', '.join(known) or '(none)'}."
            )
        params[key] = check_kind(f"parameter {key!r} of table generator {generator!r}", value, signature[key].annotation)
    return func(**params)  # type: ignore[operator]

