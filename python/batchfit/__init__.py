"""batchfit's Python helper: step lines and gradient-noise measurements for
`batchfit run`.

    from batchfit.torch import NoiseProbe      # PyTorch (imports torch)
    from batchfit.keras import NoiseModel      # Keras 3, TensorFlow backend (imports keras)

This package imports neither framework itself; `batchfit.core` is plain Python.
"""
from .core import (  # noqa: F401
    DEFAULT_BUDGET,
    DEFAULT_FIRST,
    DEFAULT_K,
    PREFIX,
    Schedule,
    Split,
    emit,
    line,
    noise_fields,
    noise_from_grads,
    plan_split,
    split_batch,
    sq_norm,
)

__version__ = "0.1.0"
