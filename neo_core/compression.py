"""Compressors: reduced-precision communication of embeddings and their gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


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
            if value not in _PRECISION_BYTES:
                raise ConfigError(
                    f"compression {self.name!r}: {key}={value!r} is not a precision; choose one of "
                    f"{', '.join(_PRECISION_BYTES)}."
                )

    @property
    def forward_bytes(self) -> int:
        return _PRECISION_BYTES[self.forward_precision]

    @property
    def backward_bytes(self) -> int:
        return _PRECISION_BYTES[self.backward_precision]

    def qcomms_config(self) -> Any:
        """TorchRec ``QCommsConfig`` for the sharders, or None when uncompressed."""
        if self.forward_precision == "fp32" and self.backward_precision == "fp32":
            return None
        from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig

        return QCommsConfig(
            forward_precision=CommType(self.forward_precision),
            backward_precision=CommType(self.backward_precision),
        )

    def qcomm_codecs_registry(self) -> dict[str, Any] | None:
        config = self.qcomms_config()
        if config is None:
            return None
        from torchrec.distributed.fbgemm_qcomm_codec import get_qcomm_codecs_registry

        return get_qcomm_codecs_registry(qcomms_config=config)
