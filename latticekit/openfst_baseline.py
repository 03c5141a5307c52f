"""The OpenFst p-best baseline: compose a draft lattice with the model FST, ``shortestpath``.

:class:`OpenFstRescorer` is the baseline a user would otherwise pick for rescoring a draft
lattice, which ``benchmarks/rescore_latency.py`` measures :func:`latticekit.pbest` against:
``compose`` the lattice with the model and take ``shortestpath(nshortest=p)``. It is
an approximation: composition may take an epsilon back-off arc even where the model has the
word at the higher order, so some paths are scored with a back-off they should not get (and
the p best can differ from the exact ones). Fairness: the lattice is arc-sorted on output
labels and the model's input-label-sorted property is computed once (without the cached
property ``compose`` re-checks it and runs about three times slower). Needs pynini.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.fst import ngramlm_to_fst, tables_to_fst

__all__ = ["lattice_to_fst", "OpenFstRescorer"]


def _pywrapfst() -> Any:
    import pywrapfst

    return pywrapfst


def lattice_to_fst(
    tokens: np.ndarray,
    scores: np.ndarray,
    label_of_token: np.ndarray,
    widths: Optional[np.ndarray] = None,
    context_labels: Sequence[int] = (),
) -> Any:
    """A sausage lattice as a linear-chain acceptor (costs ``-score``), arc-sorted on olabels.

    Args:
        tokens (`np.ndarray` of shape `(h, k)`, int32): candidate tokens per position.
        scores (`np.ndarray` of shape `(h, k)`, float): natural-log draft scores.
        label_of_token: FST label of each token id (0 where the model lacks the token).
        widths (`np.ndarray` of shape `(h,)`): arcs used per position (default all ``k``).
        context_labels: labels of a fixed prefix walked first (cost 0).

    Returns:
        A ``pywrapfst.VectorFst``.
    """
    fst = _pywrapfst()
    tokens = np.asarray(tokens)
    scores = np.asarray(scores, np.float64)
    h, k = tokens.shape
    widths = np.full(h, k) if widths is None else np.asarray(widths)
    f = fst.VectorFst()
    n_ctx = len(context_labels)
    f.add_states(h + n_ctx + 1)
    f.set_start(0)
    one = fst.Weight.one(f.weight_type())
    for i, lab in enumerate(context_labels):
        f.add_arc(i, fst.Arc(int(lab), int(lab), one, i + 1))
    labels = label_of_token[tokens]
    for i in range(h):
        for j in range(int(widths[i])):
            lab = int(labels[i, j])
            if lab <= 0:
                continue  # the model has no such word: no finite path through it
            f.add_arc(n_ctx + i, fst.Arc(lab, lab, fst.Weight(f.weight_type(), -float(scores[i, j])), n_ctx + i + 1))
    f.set_final(n_ctx + h)
    f.arcsort("olabel")
    return f


class OpenFstRescorer:
    """Reference p-best rescoring through OpenFst: compose + ``shortestpath(nshortest=p)``.

    The model is turned into a prefix-scoring acceptor once (every state final with weight
    1, no ``</s>``), its weights are scaled by ``alpha`` once per ``alpha`` and its
    input-label-sorted property is computed once, so each query only composes.

    Args:
        model: a ``latticekit.lm.BackoffModel``, a latticekit ``NGramLM`` or an OpenGrm model FST.
        bos: score the lattice right after ``<s>`` (default) rather than from the unigram state.
    """

    def __init__(self, model: Any, bos: bool = True) -> None:
        fst = _pywrapfst()
        if hasattr(model, "log10_tables"):  # a latticekit.lm.BackoffModel
            lm_fst = tables_to_fst(model.words, model.log10_tables())
        elif hasattr(model, "ngrams"):
            lm_fst = ngramlm_to_fst(model)
        else:
            lm_fst = fst.Fst.read(model) if isinstance(model, str) else model
        self._base = lm_fst.copy()
        syms = self._base.input_symbols()
        label_by_token: Dict[int, int] = {}
        for label, sym in syms:
            if label and sym.isdigit():
                label_by_token[int(sym)] = label
        size = (max(label_by_token) + 1) if label_by_token else 1
        self.label_of_token = np.zeros(size, np.int64)
        for t, l in label_by_token.items():
            self.label_of_token[t] = l
        one = fst.Weight.one(self._base.weight_type())
        for s in self._base.states():
            self._base.set_final(s, one)
        if not bos:
            start = self._base.start()
            for arc in self._base.arcs(start):
                if arc.ilabel == 0:
                    self._base.set_start(arc.nextstate)
                    break
        self._scaled: Dict[float, Any] = {}

    def _model(self, alpha: float) -> Any:
        fst = _pywrapfst()
        m = self._scaled.get(alpha)
        if m is None:
            m = self._base.copy()
            if alpha != 1.0:
                for s in m.states():
                    it = m.mutable_arcs(s)
                    while not it.done():
                        arc = it.value()
                        arc.weight = fst.Weight(m.weight_type(), alpha * float(arc.weight))
                        it.set_value(arc)
                        it.next()
            m.arcsort("ilabel")
            m.properties(fst.I_LABEL_SORTED, True)  # computed once, then cached in the FST
            self._scaled[alpha] = m
        return m

    def lattice(self, tokens: np.ndarray, scores: np.ndarray, widths: Optional[np.ndarray] = None) -> Any:
        """The lattice acceptor for this model's labels (see :func:`lattice_to_fst`)."""
        tokens = np.asarray(tokens)
        table = self.label_of_token
        if tokens.size and tokens.max() >= len(table):
            table = np.concatenate([table, np.zeros(int(tokens.max()) + 1 - len(table), np.int64)])
        return lattice_to_fst(tokens, scores, table, widths)

    def pbest(
        self,
        tokens: np.ndarray,
        scores: np.ndarray,
        p: int,
        alpha: float = 1.0,
        widths: Optional[np.ndarray] = None,
        unique: bool = True,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """The ``p`` best paths of ``draft score + alpha * ln p_lm`` through OpenFst.

        Args:
            tokens (`np.ndarray` of shape `(h, k)`): lattice tokens (token ids).
            scores (`np.ndarray` of shape `(h, k)`): natural-log draft scores.
            p: number of paths.
            alpha: weight of the language model.
            widths (`np.ndarray` of shape `(h,)`): arcs used per position.
            unique: return ``p`` distinct token sequences: the composition is projected to
                its input labels and epsilon-removed first, then ``shortestpath(nshortest=p,
                unique=True)``. With ``False``, ``shortestpath(nshortest=p)`` runs straight on
                the composition (the cheaper pipeline; for ``p > 1`` one token sequence may
                come back several times, once per back-off route).

        Returns:
            (paths (int64 `[m, h]` token ids, m <= p, best first), total scores (float64 `[m]`)).
        """
        fst = _pywrapfst()
        lat = self.lattice(tokens, scores, widths)
        composed = fst.compose(lat, self._model(alpha), connect=True)
        if unique:
            composed.project("input")
            composed.rmepsilon()
        best = fst.shortestpath(composed, nshortest=p, unique=unique)
        return _paths(best, np.asarray(tokens).shape[0], self._token_of_label())

    def _token_of_label(self) -> np.ndarray:
        inv = getattr(self, "_inv", None)
        if inv is None:
            inv = np.full(int(self.label_of_token.max()) + 1, -1, np.int64)
            nz = np.flatnonzero(self.label_of_token)
            inv[self.label_of_token[nz]] = nz
            self._inv = inv
        return inv


def _paths(best: Any, h: int, token_of_label: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    start = best.start()
    if start < 0:
        return np.zeros((0, h), np.int64), np.zeros(0)
    out_paths: List[List[int]] = []
    out_costs: List[float] = []
    for first in best.arcs(start):
        labels = [first.ilabel]
        cost = float(first.weight)
        s = first.nextstate
        while True:
            arcs = list(best.arcs(s))
            if not arcs:
                cost += float(best.final(s))
                break
            a = arcs[0]
            if a.ilabel:
                labels.append(a.ilabel)
            cost += float(a.weight)
            s = a.nextstate
        out_paths.append([int(token_of_label[l]) for l in labels if l])
        out_costs.append(cost)
    order = np.argsort(out_costs, kind="stable")
    paths = np.array([out_paths[i] for i in order], dtype=np.int64).reshape(len(order), -1)
    return paths, -np.asarray(out_costs)[order]
