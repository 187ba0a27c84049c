"""Built-in compressors: TorchRec quantized communication of pooled embeddings and gradients."""

from __future__ import annotations

from neo_core import hookimpl
from neo_core.compression import Compressor
from neo_core.registry import Registry


def no_compression() -> Compressor:
    """Full-precision (fp32) communication."""
    return Compressor(name="none")


def fp16_compression(backward: str = "fp16") -> Compressor:
    """fp16 forward all-to-all; backward in compression.backward (fp32/fp16/bf16/fp8/int8).

    Over gloo, fp8 and int8 run only where the plan's collectives carry them."""
    return _checked("fp16", "fp16", backward)


def bf16_compression(backward: str = "bf16") -> Compressor:
    """bf16 forward all-to-all; backward in compression.backward (fp32/fp16/bf16/fp8/int8).

    Over gloo, fp8 and int8 run only where the plan's collectives carry them."""
    return _checked("bf16", "bf16", backward)


def _checked(name: str, forward: str, backward: str) -> Compressor:
    # any precision Compressor knows; a training run over gloo refuses one its plan's
    # collectives cannot carry, naming the tables (run.py, check_compression_on_gloo)
    from neo_core.errors import ConfigError

    if isinstance(backward, str):  # FP16 as fp16, as kernel.optimizer=ADAM is adam
        backward = backward.lower()
    try:
        return Compressor(name=name, forward_precision=forward, backward_precision=backward)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("backward_precision=", "compression.backward=")) from None


@hookimpl
def neo_register_compressors(registry: Registry) -> None:
    registry.register("none", no_compression)
    registry.register("fp16", fp16_compression)
    registry.register("bf16", bf16_compression)
