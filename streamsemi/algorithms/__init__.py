"""Semi-supervised algorithms, looked up by name.

Each algorithm lives in its own module; :data:`REGISTRY` maps the public names
used by the daemon's configuration and by ``streamsemi evaluate`` to
``(module, class, fixed constructor parameters)``. Modules are imported lazily so
that a missing or broken algorithm makes only that name unavailable.
"""

from __future__ import annotations

import importlib
from typing import Any

from streamsemi.algorithms.base import DegenerateInputError

REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "constrained-kmeans": ("streamsemi.algorithms.constrained_kmeans", "ConstrainedKMeans", {}),
    "seeded-kmeans": ("streamsemi.algorithms.constrained_kmeans", "ConstrainedKMeans", {"constrained": False}),
    "semi-ldc": ("streamsemi.algorithms.semi_ldc", "SemiLDC", {}),
    "cle": ("streamsemi.algorithms.cle", "CLE", {}),
    "d-lda": ("streamsemi.algorithms.dlda", "DLDA", {}),
    "fsl-sk": ("streamsemi.algorithms.fsl", "FSL", {"variant": "sk"}),
    "fsl-ck": ("streamsemi.algorithms.fsl", "FSL", {"variant": "ck"}),
    "fsl-ap": ("streamsemi.algorithms.fsl", "FSL", {"variant": "ap"}),
    "fsl-sap": ("streamsemi.algorithms.fsl", "FSL", {"variant": "sap"}),
    "pseudo-lsc": ("streamsemi.algorithms.pseudo_lsc", "PseudoLSC", {}),
}

_CLASS_MODULES = {cls: mod for mod, cls, _ in REGISTRY.values()}
_CLASS_MODULES["ConstrainedPLSA"] = "streamsemi.algorithms.semi_ldc"


class AlgorithmNotAvailable(LookupError):
    """The named algorithm is unknown or its module cannot be imported."""


def algorithm_class(name: str) -> tuple[type, dict[str, Any]]:
    """Return ``(estimator class, fixed parameters)`` for a registry name."""
    if name not in REGISTRY:
        raise AlgorithmNotAvailable(f"unknown algorithm {name!r}; known: {', '.join(sorted(REGISTRY))}")
    module, cls, fixed = REGISTRY[name]
    try:
        return getattr(importlib.import_module(module), cls), dict(fixed)
    except (ImportError, AttributeError) as exc:
        raise AlgorithmNotAvailable(f"algorithm {name!r} is not available: {exc}") from exc


def make_estimator(name: str, **params: Any) -> Any:
    """Instantiate the estimator registered as ``name`` with extra ``params``."""
    cls, fixed = algorithm_class(name)
    fixed.update(params)
    return cls(**fixed)


def is_available(name: str) -> bool:
    """True when ``name`` is registered and its module imports."""
    try:
        algorithm_class(name)
    except AlgorithmNotAvailable:
        return False
    return True


def __getattr__(attr: str) -> Any:
    if attr in _CLASS_MODULES:
        return getattr(importlib.import_module(_CLASS_MODULES[attr]), attr)
    raise AttributeError(f"module 'streamsemi.algorithms' has no attribute {attr!r}")


__all__ = ["REGISTRY", "AlgorithmNotAvailable", "DegenerateInputError", "algorithm_class",
           "make_estimator", "is_available"]
