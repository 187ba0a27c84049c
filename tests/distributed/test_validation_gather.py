"""Held-out results gathered over ranks: every rank's samples once, in rank order, also when
the ranks hold different numbers of them (all_gather alone needs equal sizes: gloo aborted)."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.multi_process import MultiProcessRunner


def _gather(rank: int, world_size: int) -> torch.Tensor:
    from neo_core.training.module import _gather_uneven

    mine = torch.arange(rank + 2, dtype=torch.float32) + 10 * rank  # 2, 3 and 4 values
    return _gather_uneven(mine)


def _gather_with_an_empty_rank(rank: int, world_size: int) -> torch.Tensor:
    from neo_core.training.module import _gather_uneven

    return _gather_uneven(torch.arange(rank, dtype=torch.float32) + 10 * rank)  # rank 0 holds none


@pytest.mark.slow  # spawns 3 gloo ranks twice
def test_uneven_held_out_samples_are_gathered_once_each() -> None:
    out = MultiProcessRunner().run(_gather, 3)
    expected = torch.tensor([0, 1, 10, 11, 12, 20, 21, 22, 23], dtype=torch.float32)
    assert all(torch.equal(o, expected) for o in out)
    out = MultiProcessRunner().run(_gather_with_an_empty_rank, 3)
    assert all(torch.equal(o, torch.tensor([10, 20, 21], dtype=torch.float32)) for o in out)


def test_the_auc_ranks_logits_beyond_a_float32_sigmoids_saturation() -> None:
    # the held-out predictions were float32 sigmoids, which tie at 1.0 past a logit of about 17
    # (and float64 ones past 37): these ranked as if 30, 40 and 45 were equal
    import math
    from types import SimpleNamespace

    from neo_core.training.module import NeoModule

    logits = torch.tensor([20.0, 25.0, 30.0, 40.0, 45.0, 45.0])  # past float64's saturation too, and a tie
    labels = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    logged: dict[str, float] = {}
    module = SimpleNamespace(_val_preds=[logits[:2], logits[2:]], _val_labels=[labels[:2], labels[2:]],
                             _said_one_class=False, val_history=[], global_step=3, step_offset=0,
                             device=torch.device("cpu"), log=lambda key, value, **kw: logged.__setitem__(key, value))
    NeoModule.on_validation_epoch_end(module)  # type: ignore[arg-type]
    # positives 30, 45, 45 over negatives 20, 25, 40: 8 of 9 pairs in order
    assert module.val_history == [{"step": 3, "auc": pytest.approx(8 / 9, abs=1e-6), "loss": logged["val/loss"]}]
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double())
    assert math.isclose(logged["val/loss"], float(expected))  # the loss of the logits, no clamped sigmoid
