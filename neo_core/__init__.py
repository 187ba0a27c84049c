"""Neo: fast, scalable training of deep-learning recommendation models on TorchRec."""

from neo_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
