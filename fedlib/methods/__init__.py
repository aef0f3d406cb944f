"""Client-side pruning methods: one module each, registered here by name."""

from __future__ import annotations

from fedlib.methods.base import LayerPruner
from fedlib.methods.besa import BESAPruner
from fedlib.methods.magnitude import MagnitudePruner
from fedlib.methods.owl import OWLPruner
from fedlib.methods.sparsegpt import SparseGPTPruner, SparseGPTUpdatePruner
from fedlib.methods.wanda import WandaPruner

METHODS: dict[str, type[LayerPruner]] = {
    cls.name: cls
    for cls in (MagnitudePruner, WandaPruner, SparseGPTPruner, SparseGPTUpdatePruner,
                OWLPruner, BESAPruner)
}


def get_method(name: str) -> type[LayerPruner]:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown pruning method {name!r}; known: {sorted(METHODS)}") from None


def method_allocation(name: str) -> str:
    """``"nonuniform"`` for methods whose per-layer sparsity varies (OWL, BESA), else
    ``"uniform"``: what a client's mask file records in its ``allocation`` field."""
    return get_method(name).allocation


__all__ = ["LayerPruner", "METHODS", "get_method", "method_allocation"]
