"""OpenFst interop of :class:`~latticekit.lm.model.BackoffModel` (needs pynini).

The conversion itself is the core's (:mod:`latticekit.fst`: one converter pair on n-gram
tables); these wrap it for back-off models. ``ngramlm_to_fst``, ``ngramlm_from_fst`` and the
OpenFst p-best baseline (``lattice_to_fst``, ``OpenFstRescorer``, now in
:mod:`latticekit.openfst_baseline`) are re-exported here so that existing imports keep working.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from latticekit.fst import ngramlm_to_fst, tables_from_fst, tables_to_fst
from latticekit.lm.model import BackoffModel
from latticekit.ngram import NGramLM
from latticekit.openfst_baseline import OpenFstRescorer, lattice_to_fst

__all__ = [
    "model_to_fst",
    "model_from_fst",
    "ngramlm_to_fst",
    "ngramlm_from_fst",
    "lattice_to_fst",
    "OpenFstRescorer",
]


def model_to_fst(model: BackoffModel) -> Any:
    """The OpenGrm model FST of a back-off model (see :func:`latticekit.fst.tables_to_fst`).

    Args:
        model: the model; ``<unk>`` n-grams, if any, are dropped (OpenGrm has none).

    Returns:
        A ``pywrapfst.VectorFst`` (standard tropical arcs) with symbol tables attached,
        arc-sorted on input labels, which OpenGrm's tools accept.
    """
    return tables_to_fst(model.words, model.log10_tables())


def model_from_fst(fst_model: Any, words: Optional[Sequence[str]] = None) -> BackoffModel:
    """Read an OpenGrm model FST into a :class:`BackoffModel` (see
    :func:`latticekit.fst.tables_from_fst`).

    Args:
        fst_model: a ``pywrapfst`` FST (or a path to one) in OpenGrm's model format with an
            input symbol table.
        words: optional word table to number words with (``<unk>``, ``<s>``, ``</s>`` first).

    Returns:
        The model; scoring it equals scoring the ARPA that ``ngramprint --ARPA`` would print
        (to the float32 precision of the FST's weights).

    Raises:
        ValueError: if the FST is not an n-gram model (no start state, no back-off from it,
            no symbol table).
    """
    table, tables = tables_from_fst(fst_model, words)
    return BackoffModel.from_arrays(table, [t[0] for t in tables], [t[1] for t in tables], [t[2] for t in tables])


def ngramlm_from_fst(fst_model: Any, vocab: Optional[Sequence[str]] = None) -> NGramLM:
    """``NGramLM.from_fst()``: a latticekit ``NGramLM`` from an OpenGrm model FST."""
    return NGramLM.from_fst(fst_model, vocab)
