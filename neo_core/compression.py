"""Compressors: reduced-precision communication of embeddings and their gradients."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# bytes an element takes on the wire; FBGEMM's int8 is row-wise over rows of 32 elements, each
# with an fp32 scale and bias (QuantizedCommCodec.calc_quantized_size: 32 + 8 bytes per 32)
_PRECISION_BYTES: dict[str, float] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1.25}


def not_a_precision(key: str, value: Any) -> str:
    """"<key>=<value> is not a precision; choose one of ...", with the precision a number given
    for one stands for (16 or '16': fp16) where one does."""
    close, bits = None, ""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        bits = str(int(value))
    elif isinstance(value, str) and value.strip().isdigit():  # '16', quoted
        bits = value.strip()
    if bits:
        fits = [p for p in _PRECISION_BYTES if p.endswith(bits) and p[: -len(bits)].isalpha()]
        close = next((p for p in fits if p.startswith("fp")), fits[0] if fits else None)
    hint = f" (did you mean {close}?)" if close else ""
    return f"{key}={value!r} is not a precision; choose one of {', '.join(_PRECISION_BYTES)}{hint}."


@dataclass(frozen=True)
class Compressor:
    """Precision of the forward (pooled embeddings) and backward (gradients) all-to-alls."""

    name: str
    forward_precision: str = "fp32"
    backward_precision: str = "fp32"

    def __post_init__(self) -> None:
        from neo_core.errors import ConfigError

        for key in ("forward_precision", "backward_precision"):
            value = getattr(self, key)
            if not isinstance(value, str) or value not in _PRECISION_BYTES:
                raise ConfigError(f"compression {self.name!r}: {not_a_precision(key, value)}")

    @property
    def forward_bytes(self) -> float:
        return _PRECISION_BYTES[self.forward_precision]

    @property
    def backward_bytes(self) -> float:
        return _PRECISION_BYTES[self.backward_precision]

    # TorchRec has no fp8 reduce-scatter: its codec registry (get_qcomm_codecs_registry) sends
    # the reduce-scatter of row-split tables (RW; TWRW and GRID inside the node) in fp16 where
    # fp8 is asked for forward and in bf16 where it is asked for backward
    @property
    def reduce_scatter_forward_precision(self) -> str:
        return "fp16" if self.forward_precision == "fp8" else self.forward_precision

    @property
    def reduce_scatter_backward_precision(self) -> str:
        return "bf16" if self.backward_precision == "fp8" else self.backward_precision

    @property
    def reduce_scatter_forward_bytes(self) -> float:
        return _PRECISION_BYTES[self.reduce_scatter_forward_precision]

    @property
    def reduce_scatter_backward_bytes(self) -> float:
        return _PRECISION_BYTES[self.reduce_scatter_backward_precision]

    def qcomms_config(self) -> Any:
        """TorchRec ``QCommsConfig`` for the sharders, or None when uncompressed."""
        if self.forward_precision == "fp32" and self.backward_precision == "fp32":
            return None
        from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig

        with _root_log_quiet():
            return QCommsConfig(
                forward_precision=CommType(self.forward_precision),
                backward_precision=CommType(self.backward_precision),
            )

    def qcomm_codecs_registry(self) -> dict[str, Any] | None:
        config = self.qcomms_config()
        if config is None:
            return None
        from torchrec.distributed.fbgemm_qcomm_codec import get_qcomm_codecs_registry

        with _root_log_quiet():
            return get_qcomm_codecs_registry(qcomms_config=config)


@contextlib.contextmanager
def _root_log_quiet() -> Iterator[None]:
    """TorchRec and FBGEMM log each codec they create on the root logger (INFO) and warn there
    about fp8 row dims; the plan's notes and Neo's checks say what matters about precisions."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)
