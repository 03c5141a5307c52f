"""OpenFst interop through pywrapfst (pynini): OpenGrm model FSTs and a reference p-best.

OpenGrm's model format: one state per n-gram history, the start state is the ``<s>`` history,
the unigram state is the back-off of the start state, word arcs carry ``-ln p`` (tropical),
``</s>`` is the final weight, and back-off arcs are labelled 0 (epsilon) with ``-ln alpha``.
Symbol tables map label 0 to ``<epsilon>`` and the other labels to words (``<s>`` and ``</s>``
are implicit). Nothing here is linked into latticekit's C++: pywrapfst is imported lazily.

:class:`OpenFstRescorer` is the baseline a user would otherwise pick for rescoring a draft
lattice: ``compose`` the lattice with the model and take ``shortestpath(nshortest=p)``. It is
an approximation: composition may take an epsilon back-off arc even where the model has the
word at the higher order, so some paths are scored with a back-off they should not get (and
the p best can differ from the exact ones). Fairness: the lattice is arc-sorted on output
labels and the model's input-label-sorted property is computed once (without the cached
property ``compose`` re-checks it and runs about three times slower).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.lm.model import LN10, BackoffModel
from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS, NGramTrie

__all__ = [
    "model_to_fst",
    "model_from_fst",
    "ngramlm_to_fst",
    "ngramlm_from_fst",
    "lattice_to_fst",
    "OpenFstRescorer",
]


def _pywrapfst() -> Any:
    import pywrapfst

    return pywrapfst


def _symbol_table(words: Sequence[str]) -> Tuple[Any, np.ndarray]:
    """Symbol table (``<epsilon>`` = 0, then the words other than the specials) and labels."""
    fst = _pywrapfst()
    table = fst.SymbolTable()
    table.add_symbol("<epsilon>", 0)
    label_of = np.zeros(len(words), np.int64)
    label_of[: len(SPECIAL_WORDS)] = -1
    label = 1
    for i, w in enumerate(words[len(SPECIAL_WORDS):], start=len(SPECIAL_WORDS)):
        table.add_symbol(w, label)
        label_of[i] = label
        label += 1
    return table, label_of


def model_to_fst(model: BackoffModel) -> Any:
    """The OpenGrm model FST of a back-off model.

    Args:
        model: the model; ``<unk>`` n-grams, if any, are dropped (OpenGrm has none).

    Returns:
        A ``pywrapfst.VectorFst`` (standard tropical arcs) with symbol tables attached,
        arc-sorted on input labels, which OpenGrm's tools accept.
    """
    fst = _pywrapfst()
    N = model.order
    table, label_of = _symbol_table(model.words)
    # States: 0 = unigram state, then one per n-gram that opens a state (has extensions).
    state_of: List[np.ndarray] = []
    n_states = 1
    for k in range(1, N):
        opens = model.child_counts(k) > 0
        if k == 1:
            opens |= np.asarray(model.word[0]) == BOS
        s = np.full(model.total(k), -1, np.int64)
        s[opens] = np.arange(n_states, n_states + int(opens.sum()))
        n_states += int(opens.sum())
        state_of.append(s)
    state_of.append(np.full(model.total(N), -1, np.int64))
    bos_row = int(np.flatnonzero(np.asarray(model.word[0]) == BOS)[0])
    start = int(state_of[0][bos_row])
    # The state an n-gram leads to: its own state, else that of its longest suffix with one.
    dest: List[np.ndarray] = []
    for k in range(1, N + 1):
        d = state_of[k - 1].copy()
        if k == 1:
            d[d < 0] = 0
        else:
            suffix = model.suffix_rows(k)
            lower = dest[k - 2][suffix]
            d = np.where(d >= 0, d, lower)
        dest.append(d)
    lines: List[str] = []
    finals: List[str] = []
    for k in range(1, N + 1):
        words = np.asarray(model.word[k - 1])
        src = np.zeros(model.total(k), np.int64) if k == 1 else state_of[k - 2][np.asarray(model.prefix[k - 1])]
        cost = -np.asarray(model.log10_prob[k - 1], np.float64) * LN10
        is_final = words == EOS
        is_arc = words >= len(SPECIAL_WORDS)
        if is_final.any():
            finals.append(_fmt_finals(src[is_final], cost[is_final]))
        if is_arc.any():
            lines.append(_fmt_arcs(src[is_arc], dest[k - 1][is_arc], label_of[words[is_arc]], cost[is_arc]))
        if k < N:
            has_state = state_of[k - 1] >= 0
            bo = np.nan_to_num(np.asarray(model.log10_backoff[k - 1], np.float64), nan=0.0)
            from_state = state_of[k - 1][has_state]
            if k == 1:
                to_state = np.zeros(len(from_state), np.int64)
            else:
                to_state = state_of[k - 2][model.suffix_rows(k)[has_state]]
            lines.append(_fmt_arcs(from_state, to_state, np.zeros(len(from_state), np.int64), -bo[has_state] * LN10))
    compiler = fst.Compiler(keep_state_numbering=True, acceptor=True)
    compiler.write("".join(lines) + "".join(finals))
    out = compiler.compile()
    out.set_start(start)
    out.set_input_symbols(table)
    out.set_output_symbols(table)
    out.arcsort("ilabel")
    return out


def _fmt_arcs(src: np.ndarray, dst: np.ndarray, label: np.ndarray, cost: np.ndarray) -> str:
    n = len(src)
    if n == 0:
        return ""
    fields = np.empty((n, 4), dtype=object)
    fields[:, 0] = src.tolist()
    fields[:, 1] = dst.tolist()
    fields[:, 2] = label.tolist()
    fields[:, 3] = np.asarray(cost, np.float32).astype(np.float64).tolist()
    return ("%d\t%d\t%d\t%.9g\n" * n) % tuple(fields.ravel().tolist())


def _fmt_finals(state: np.ndarray, cost: np.ndarray) -> str:
    n = len(state)
    fields = np.empty((n, 2), dtype=object)
    fields[:, 0] = state.tolist()
    fields[:, 1] = np.asarray(cost, np.float32).astype(np.float64).tolist()
    return ("%d\t%.9g\n" * n) % tuple(fields.ravel().tolist())


def model_from_fst(fst_model: Any, words: Optional[Sequence[str]] = None) -> BackoffModel:
    """Read an OpenGrm model FST into a :class:`BackoffModel`.

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
    fst = _pywrapfst()
    f = fst.Fst.read(fst_model) if isinstance(fst_model, str) else fst_model
    syms = f.input_symbols()
    if syms is None:
        raise ValueError("the FST has no input symbol table")
    arc_src, arc_dst, arc_lab, arc_w, fin_state, fin_w = _fst_arrays(f)
    n_states = f.num_states()
    start = f.start()
    if start < 0:
        raise ValueError("the FST has no start state")
    is_bo = arc_lab == 0
    bo_dest = np.full(n_states, -1, np.int64)
    bo_cost = np.zeros(n_states)
    bo_dest[arc_src[is_bo]] = arc_dst[is_bo]
    bo_cost[arc_src[is_bo]] = arc_w[is_bo]
    unigram = int(bo_dest[start])
    if unigram < 0:
        raise ValueError("the start state has no back-off arc: not an OpenGrm n-gram model")
    # Word table: label -> internal id.
    table = list(words) if words is not None else list(SPECIAL_WORDS)
    index = {w: i for i, w in enumerate(table)}
    max_label = max(int(arc_lab.max()) if len(arc_lab) else 0, syms.num_symbols())
    word_of_label = np.full(max_label + 1, -1, np.int64)
    for label, sym in syms:
        if label == 0:
            continue
        i = index.get(sym)
        if i is None:
            i = len(table)
            index[sym] = i
            table.append(sym)
        if label <= max_label:
            word_of_label[label] = i
    # State orders, level by level, as OpenGrm's breadth-first ComputeStateOrders.
    order = np.full(n_states, -1, np.int64)
    order[unigram] = 1
    order[start] = 2
    parent = np.full(n_states, -1, np.int64)
    via = np.full(n_states, -1, np.int64)
    word_arcs = ~is_bo
    src_w, dst_w, lab_w, cost_w = arc_src[word_arcs], arc_dst[word_arcs], arc_lab[word_arcs], arc_w[word_arcs]
    level = 1
    while True:
        frontier = order[src_w] == level
        new = frontier & (order[dst_w] == -1)
        if not frontier.any():
            break
        cand_dst = dst_w[new]
        first = np.unique(cand_dst, return_index=True)[1]
        sel = np.flatnonzero(new)[first]
        order[dst_w[sel]] = level + 1
        parent[dst_w[sel]] = src_w[sel]
        via[dst_w[sel]] = word_of_label[lab_w[sel]]
        level += 1
        if level > n_states + 2:
            break
    hi_order = int(order.max())
    # History (as internal ids) of each state, built level by level.
    hist_of_state = np.full((n_states, max(hi_order - 1, 1)), -1, np.int64)
    hist_of_state[start, 0] = BOS
    for o in range(2, hi_order + 1):
        states = np.flatnonzero((order == o) & (parent >= 0))
        hist_of_state[states, : o - 2] = hist_of_state[parent[states], : o - 2]
        hist_of_state[states, o - 2] = via[states]
    ids_per_order: List[List[np.ndarray]] = [[] for _ in range(hi_order)]
    probs: List[List[np.ndarray]] = [[] for _ in range(hi_order)]
    src_order = order[src_w]
    for o in range(1, hi_order + 1):
        at = src_order == o
        h = hist_of_state[src_w[at], : o - 1]
        ids_per_order[o - 1].append(np.concatenate([h, word_of_label[lab_w[at]][:, None]], axis=1))
        probs[o - 1].append(-cost_w[at] / LN10)
        fin = order[fin_state] == o
        hf = hist_of_state[fin_state[fin], : o - 1]
        ids_per_order[o - 1].append(np.concatenate([hf, np.full((int(fin.sum()), 1), EOS)], axis=1))
        probs[o - 1].append(-fin_w[fin] / LN10)
    # <s> unigram (ARPA convention -99)
    ids_per_order[0].append(np.array([[BOS]]))
    probs[0].append(np.array([-99.0]))
    ids = [np.concatenate(x, axis=0) for x in ids_per_order]
    trie = NGramTrie.from_ngram_ids(len(table), ids)
    model = BackoffModel(len(table), trie.prefix, trie.word, table)
    # back-off weight of each n-gram = back-off arc of the state whose history it is
    state_rows = {}
    for o in range(2, hi_order + 1):
        states = np.flatnonzero(order == o)
        rows = trie.lookup_ngrams(hist_of_state[states, : o - 1])
        state_rows[o - 1] = (rows, states)
    for k in range(1, hi_order + 1):
        p = np.empty(trie.total(k))
        p[trie.lookup_ngrams(ids[k - 1])] = np.concatenate(probs[k - 1])
        b = np.full(trie.total(k), np.nan)
        if k in state_rows:
            rows, states = state_rows[k]
            ok = (rows >= 0) & (bo_dest[states] >= 0)
            b[rows[ok]] = -bo_cost[states[ok]] / LN10
        model.log10_prob.append(p)
        model.log10_backoff.append(b)
    return model


def _fst_arrays(f: Any) -> Tuple[np.ndarray, ...]:
    """Arcs (source, destination, label, cost) and final costs of an FST, as arrays.

    (One Python step per arc: pywrapfst has no bulk accessor, and its text printer rounds
    weights to 6 digits.)
    """
    fst = _pywrapfst()
    zero = fst.Weight.zero(f.weight_type())
    src: List[int] = []
    dst: List[int] = []
    lab: List[int] = []
    cost: List[float] = []
    fin_state: List[int] = []
    fin_cost: List[float] = []
    for s in f.states():
        for a in f.arcs(s):
            src.append(s)
            dst.append(a.nextstate)
            lab.append(a.ilabel)
            cost.append(float(a.weight))
        fw = f.final(s)
        if fw != zero:
            fin_state.append(s)
            fin_cost.append(float(fw))
    return (
        np.asarray(src, np.int64),
        np.asarray(dst, np.int64),
        np.asarray(lab, np.int64),
        np.asarray(cost, np.float64),
        np.asarray(fin_state, np.int64),
        np.asarray(fin_cost, np.float64),
    )


def ngramlm_to_fst(lm: Any) -> Any:
    """``NGramLM.to_fst()``: the OpenGrm model FST of a latticekit ``NGramLM``.

    Args:
        lm: an ``NGramLM`` (anything with ``words``, ``order`` and ``ngrams(order)``).

    Returns:
        A ``pywrapfst.VectorFst`` in OpenGrm's model format.
    """
    return model_to_fst(_model_of_ngramlm(lm))


def _model_of_ngramlm(lm: Any) -> BackoffModel:
    words = list(lm.words)
    ids, probs, bos = [], [], []
    for k in range(1, lm.order + 1):
        i, p, b = lm.ngrams(k)
        ids.append(np.asarray(i, np.int64))
        probs.append(np.asarray(p, np.float64))
        bos.append(np.asarray(b, np.float64))
    return BackoffModel.from_arrays(words, ids, probs, bos)


def ngramlm_from_fst(fst_model: Any, vocab: Optional[Sequence[str]] = None) -> Any:
    """``NGramLM.from_fst()``: a latticekit ``NGramLM`` from an OpenGrm model FST.

    Args:
        fst_model: a ``pywrapfst`` FST or a path.
        vocab: passed to ``NGramLM.from_ngrams`` (strings indexed by token id).

    Returns:
        ``NGramLM.from_ngrams(words, tables, vocab)``.
    """
    from latticekit import NGramLM  # type: ignore[attr-defined]

    model = model_from_fst(fst_model)
    return NGramLM.from_ngrams(model.words, model.tables(), vocab=vocab)


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
        model: a :class:`BackoffModel`, a latticekit ``NGramLM`` or an OpenGrm model FST.
        bos: score the lattice right after ``<s>`` (default) rather than from the unigram state.
    """

    def __init__(self, model: Any, bos: bool = True) -> None:
        fst = _pywrapfst()
        if isinstance(model, BackoffModel):
            lm_fst = model_to_fst(model)
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
