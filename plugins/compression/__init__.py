"""Built-in compressors: TorchRec quantized communication of pooled embeddings and gradients."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.compression import Compressor
from neo_core.registry import Registry


def no_compression() -> Compressor:
    """Full-precision (fp32) communication."""
    return Compressor(name="none")


def fp16_compression(backward: str = "fp16") -> Compressor:
    """fp16 forward all-to-all; backward in ``backward`` precision (fp16, bf16 or fp32)."""
    return _checked("fp16", "fp16", backward)


def bf16_compression(backward: str = "bf16") -> Compressor:
    """bf16 forward all-to-all; backward in ``backward`` precision (fp16, bf16 or fp32)."""
    return _checked("bf16", "bf16", backward)


def _checked(name: str, forward: str, backward: str) -> Compressor:
    from neo_core.errors import ConfigError

    allowed = ("fp32", "fp16", "bf16")
    if backward not in allowed:
        raise ConfigError(
            f"compression.backward={backward!r} is not supported here; choose one of {', '.join(allowed)} "
            "(fp8 and int8 fail inside TorchRec on gloo)."
        )
    return Compressor(name=name, forward_precision=forward, backward_precision=backward)


@hookimpl
def neo_register_compressors(registry: Registry) -> None:
    registry.register("none", no_compression)
    registry.register("fp16", fp16_compression)
    registry.register("bf16", bf16_compression)
