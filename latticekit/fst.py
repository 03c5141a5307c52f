"""OpenGrm model FSTs: the core model's FST interchange format, through pywrapfst (pynini).

OpenGrm's model format: one state per n-gram history, the start state is the ``<s>`` history,
the unigram state is the back-off of the start state, word arcs carry ``-ln p`` (tropical),
``</s>`` is the final weight, and back-off arcs are labelled 0 (epsilon) with ``-ln alpha``.
Symbol tables map label 0 to ``<epsilon>`` and the other labels to words (``<s>`` and ``</s>``
are implicit). Nothing here is linked into latticekit's C++: pywrapfst is imported lazily.

One converter pair, on n-gram tables: :func:`tables_to_fst` and :func:`tables_from_fst`.
``NGramLM.to_fst`` / ``NGramLM.from_fst`` and :mod:`latticekit.lm.fst`'s ``BackoffModel``
converters go through them.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from latticekit.ngram_trie import BOS, EOS, SPECIAL_WORDS, NGramTrie, index_tables

__all__ = ["tables_to_fst", "tables_from_fst", "ngramlm_to_fst"]

LN10 = float(np.log(10.0))

Table = Tuple[np.ndarray, np.ndarray, np.ndarray]


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


def tables_to_fst(words: Sequence[str], tables: Sequence[Table]) -> Any:
    """The OpenGrm model FST of a set of n-gram tables.

    Args:
        words: the word table (``<unk>``, ``<s>``, ``</s>`` first); ids index it.
        tables: per order ``k``: ids (int `[n, k]`), log10_prob (float `[n]`),
            log10_backoff (float `[n]`; NaN or 0 where the n-gram opens no state), in any row
            order. ``<unk>`` n-grams, if any, are dropped (OpenGrm has none).

    Returns:
        A ``pywrapfst.VectorFst`` (standard tropical arcs) with symbol tables attached,
        arc-sorted on input labels, which OpenGrm's tools accept.

    Raises:
        ValueError: duplicate n-grams or missing histories.
    """
    trie, log10_prob, log10_backoff = index_tables(
        len(words), [t[0] for t in tables], [t[1] for t in tables], [t[2] for t in tables]
    )
    fst = _pywrapfst()
    N = trie.order
    table, label_of = _symbol_table(words)
    # States: 0 = unigram state, then one per n-gram that opens a state (has extensions).
    state_of: List[np.ndarray] = []
    n_states = 1
    for k in range(1, N):
        opens = trie.child_counts(k) > 0
        if k == 1:
            opens |= np.asarray(trie.word[0]) == BOS
        s = np.full(trie.total(k), -1, np.int64)
        s[opens] = np.arange(n_states, n_states + int(opens.sum()))
        n_states += int(opens.sum())
        state_of.append(s)
    state_of.append(np.full(trie.total(N), -1, np.int64))
    bos_row = int(np.flatnonzero(np.asarray(trie.word[0]) == BOS)[0])
    start = int(state_of[0][bos_row])
    # The state an n-gram leads to: its own state, else that of its longest suffix with one.
    dest: List[np.ndarray] = []
    for k in range(1, N + 1):
        d = state_of[k - 1].copy()
        if k == 1:
            d[d < 0] = 0
        else:
            suffix = trie.suffix_rows(k)
            lower = dest[k - 2][suffix]
            d = np.where(d >= 0, d, lower)
        dest.append(d)
    lines: List[str] = []
    finals: List[str] = []
    for k in range(1, N + 1):
        last = np.asarray(trie.word[k - 1])
        src = np.zeros(trie.total(k), np.int64) if k == 1 else state_of[k - 2][np.asarray(trie.prefix[k - 1])]
        cost = -np.asarray(log10_prob[k - 1], np.float64) * LN10
        is_final = last == EOS
        is_arc = last >= len(SPECIAL_WORDS)
        if is_final.any():
            finals.append(_fmt_finals(src[is_final], cost[is_final]))
        if is_arc.any():
            lines.append(_fmt_arcs(src[is_arc], dest[k - 1][is_arc], label_of[last[is_arc]], cost[is_arc]))
        if k < N:
            has_state = state_of[k - 1] >= 0
            bo = np.nan_to_num(np.asarray(log10_backoff[k - 1], np.float64), nan=0.0)
            from_state = state_of[k - 1][has_state]
            if k == 1:
                to_state = np.zeros(len(from_state), np.int64)
            else:
                to_state = state_of[k - 2][trie.suffix_rows(k)[has_state]]
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


def tables_from_fst(fst_model: Any, words: Optional[Sequence[str]] = None) -> Tuple[List[str], List[Table]]:
    """The n-gram tables of an OpenGrm model FST.

    Args:
        fst_model: a ``pywrapfst`` FST (or a path to one) in OpenGrm's model format with an
            input symbol table.
        words: optional word table to number words with (``<unk>``, ``<s>``, ``</s>`` first);
            words of the FST not in it are appended.

    Returns:
        ``(words, tables)``: the word table and, per order ``k``, ids (int32 `[n, k]`),
        log10_prob (float64 `[n]`) and log10_backoff (float64 `[n]`, NaN where the n-gram
        opens no state), rows in lexicographic order. Scoring them equals scoring the ARPA
        that ``ngramprint --ARPA`` would print (to the float32 precision of the FST's weights).

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
    # back-off weight of each n-gram = back-off arc of the state whose history it is
    state_rows = {}
    for o in range(2, hi_order + 1):
        states = np.flatnonzero(order == o)
        rows = trie.lookup_ngrams(hist_of_state[states, : o - 1])
        state_rows[o - 1] = (rows, states)
    tables: List[Table] = []
    for k in range(1, hi_order + 1):
        p = np.empty(trie.total(k))
        p[trie.lookup_ngrams(ids[k - 1])] = np.concatenate(probs[k - 1])
        b = np.full(trie.total(k), np.nan)
        if k in state_rows:
            rows, states = state_rows[k]
            ok = (rows >= 0) & (bo_dest[states] >= 0)
            b[rows[ok]] = -bo_cost[states[ok]] / LN10
        tables.append((trie.ngram_ids(k), p, b))
    return table, tables


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
    return tables_to_fst(list(lm.words), [lm.ngrams(k) for k in range(1, lm.order + 1)])
