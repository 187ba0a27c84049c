"""Neo: fast, scalable training of deep-learning recommendation models on TorchRec."""

import logging as _logging

# torch.fx warns on every torchrec import that is_fx_tracing's meaning changed; not actionable here.
_logging.getLogger("torch.fx._symbolic_trace").setLevel(_logging.ERROR)

from neo_core.hookspecs import hookimpl  # noqa: E402

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
