# cython: language_level=3, boundscheck=False, wraparound=False
"""Private binding of the C++ core. Users import latticekit, never this module.

Arrays cross as typed memoryviews, validated by the Python layer; every compute call runs
without the GIL.
"""

import os

import numpy as np

from latticekit._files import checked_path

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.utility cimport move
from libcpp.vector cimport vector

from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.buffer cimport PyBUF_READ
from libc.math cimport NAN, isfinite
from libc.string cimport memcpy
from libcpp.algorithm cimport sort

from latticekit._cpp cimport (ReleaseFreeMemory, CountStream, CountTable, CountTableOutput,
                              CountTableView, FormatArpaLines, RowMap,
                              MergeCountOrder, Model, NGramTables, OrderTable, ParseArpa,
                              ParseArpaHeader,
                              LookupChildren, ParseIdLines, PBestBatch, PBestOne, LatticeView,
                              LatticeBatchView, BatchPathsOut, PathsOut, StateId, Checksum64,
                              BestContinuations, TrieConditionals, Continuations, KatzState, KatzStateMemo, KatzSuccessors, NGramCache,
                              NGramCacheFollower, LogisticSgd, SourceSgd, TreeChain, PendingLabels,
                              ContinuationNodes, UniteContinuations, UniteLatticePaths)


cdef string _path_bytes(path):
    """A file path for the C++ core: str, bytes or os.PathLike, refused (FileAccessError)
    when it cannot name a file."""
    return os.fsencode(checked_path(path))


cdef class CoreModel:
    """Owns one compiled model (built or memory-mapped)."""

    @staticmethod
    def from_arpa_bytes(const unsigned char[::1] data, path, vocab):
        cdef string source = _path_bytes(path)
        cdef NGramTables tables
        cdef vector[string] c_vocab
        cdef bool has_vocab = vocab is not None
        if has_vocab:
            c_vocab.reserve(len(vocab))
            for word in vocab:
                c_vocab.push_back(word.encode("utf-8"))
        cdef const char* ptr = <const char*> &data[0] if data.shape[0] > 0 else <const char*> ""
        cdef size_t size = data.shape[0]
        cdef CoreModel self = CoreModel.__new__(CoreModel)
        with nogil:
            tables = ParseArpa(ptr, size, source)
            self.model = Model.Build(move(tables), c_vocab, has_vocab, source)
        return self

    @staticmethod
    def from_tables(words, tables, vocab, source):
        """words: list of str; tables: per order (ids int32 [n, order], log10 prob, log10 backoff)."""
        cdef NGramTables c_tables
        cdef vector[string] c_vocab
        cdef bool has_vocab = vocab is not None
        cdef string c_source = _path_bytes(source)
        cdef OrderTable* table
        cdef const int32_t[:, ::1] ids
        cdef const float[::1] prob
        cdef const float[::1] backoff
        cdef Py_ssize_t i, j
        for word in words:
            c_tables.words.push_back(word.encode("utf-8"))
        c_tables.orders.resize(len(tables))
        for n, (ids_arr, prob_arr, backoff_arr) in enumerate(tables):
            ids, prob, backoff = ids_arr, prob_arr, backoff_arr
            table = &c_tables.orders[n]
            table.ids.reserve(ids.shape[0] * ids.shape[1])
            for i in range(ids.shape[0]):
                for j in range(ids.shape[1]):
                    table.ids.push_back(ids[i, j])
                table.log10_prob.push_back(prob[i])
                table.log10_backoff.push_back(backoff[i])
        if has_vocab:
            for word in vocab:
                c_vocab.push_back(word.encode("utf-8"))
        cdef CoreModel self = CoreModel.__new__(CoreModel)
        with nogil:
            self.model = Model.Build(move(c_tables), c_vocab, has_vocab, c_source)
        return self

    @staticmethod
    def load(path):
        cdef string c_path = _path_bytes(path)
        cdef CoreModel self = CoreModel.__new__(CoreModel)
        with nogil:
            self.model = Model.Load(c_path)
        return self

    def write_image(self, f):
        """Writes the binary model's bytes to the binary file object f (no copy is made)."""
        cdef Model* m = self.model.get()
        view = PyMemoryView_FromMemory(<char*> m.image(), m.size_bytes(), PyBUF_READ)
        try:
            f.write(view)
        finally:
            view.release()  # the bytes belong to self; no view outlives this call

    @property
    def order(self):
        return self.model.get().order()

    @property
    def counts(self):
        return tuple(int(self.model.get().count(n)) for n in range(1, self.order + 1))

    @property
    def num_words(self):
        return int(self.model.get().num_words())

    @property
    def num_states(self):
        return int(self.model.get().num_states())

    @property
    def num_tokens(self):
        return int(self.model.get().num_tokens())

    @property
    def size_bytes(self):
        return int(self.model.get().size_bytes())

    @property
    def has_vocab(self):
        return True if self.model.get().has_vocab() else False

    def words(self):
        cdef Model* m = self.model.get()
        return [m.WordText(w).decode("utf-8", "surrogateescape") for w in range(m.num_words())]

    def token_log10probs(self, const int32_t[::1] tokens, const int32_t[::1] context, bint bos):
        """Per-token log10 probabilities of tokens after context."""
        out = np.empty(tokens.shape[0], dtype=np.float64)
        cdef double[::1] o = out
        cdef Model* m = self.model.get()
        cdef StateId state
        cdef size_t n = tokens.shape[0]
        cdef size_t nc = context.shape[0]
        cdef const int32_t* tp = &tokens[0] if n > 0 else NULL
        cdef const int32_t* cp = &context[0] if nc > 0 else NULL
        cdef double* op = &o[0] if n > 0 else NULL
        with nogil:
            state = m.ContextState(cp, nc, bos)
            m.Score(state, tp, n, op, NULL)
        return out

    def ngrams(self, int n):
        cdef Model* m = self.model.get()
        cdef uint64_t count = m.count(n)
        ids = np.empty((count, n), dtype=np.int32)
        prob = np.empty(count, dtype=np.float32)
        backoff = np.empty(count, dtype=np.float32)
        cdef int32_t[:, ::1] i_view = ids
        cdef float[::1] p_view = prob
        cdef float[::1] b_view = backoff
        if count > 0:
            with nogil:
                m.NGrams(n, &i_view[0, 0], &p_view[0], &b_view[0])
        return ids, prob, backoff

    def pbest_batch(self, const int32_t[:, :, ::1] tokens, const float[:, :, ::1] scores,
                    widths, context, context_offsets, bint bos, int p, double alpha,
                    int threads):
        """Raw batched search; the Python layer validates every argument first. The outputs
        have min(p, the largest number of paths of any lattice) rows per lattice."""
        cdef int64_t batch = tokens.shape[0]
        cdef int h = tokens.shape[1]
        cdef int k = tokens.shape[2]
        cdef const int32_t[:, ::1] w_view
        cdef const int32_t* w_ptr = NULL
        if widths is not None:
            w_view = widths
            w_ptr = &w_view[0, 0] if batch > 0 else NULL
        cdef int64_t b, paths, most = 0
        cdef int i
        with nogil:  # no output row beyond the paths a lattice has
            for b in range(batch):
                paths = 1
                for i in range(h):
                    paths *= w_ptr[b * h + i] if w_ptr != NULL else k
                    if paths >= p:
                        paths = p
                        break
                most = max(most, paths)
                if most == p:
                    break
        p = <int> most if batch > 0 else p
        out_tokens = np.full((batch, p, h), -1, dtype=np.int32)
        out_score = np.full((batch, p), np.nan, dtype=np.float64)
        out_draft = np.full((batch, p), np.nan, dtype=np.float64)
        out_lm = np.full((batch, p), np.nan, dtype=np.float64)
        out_count = np.zeros(batch, dtype=np.int32)
        out_pops = np.zeros(batch, dtype=np.int64)
        out_transitions = np.zeros(batch, dtype=np.int64)
        if batch == 0:
            return out_tokens, out_score, out_draft, out_lm, out_count, out_pops, out_transitions
        cdef int32_t[:, :, ::1] ot = out_tokens
        cdef double[:, ::1] osc = out_score
        cdef double[:, ::1] od = out_draft
        cdef double[:, ::1] ol = out_lm
        cdef int32_t[::1] oc = out_count
        cdef int64_t[::1] op = out_pops
        cdef int64_t[::1] otr = out_transitions
        cdef const int32_t[::1] c_view
        cdef const int64_t[::1] co_view
        cdef const int32_t* c_ptr = NULL
        cdef const int64_t* co_ptr = NULL
        cdef int32_t dummy = 0
        if context is not None:
            c_view = context
            co_view = context_offsets
            c_ptr = &c_view[0] if c_view.shape[0] > 0 else &dummy
            co_ptr = &co_view[0]
        cdef LatticeBatchView lattices
        lattices.tokens = &tokens[0, 0, 0]
        lattices.scores = &scores[0, 0, 0]
        lattices.widths = w_ptr
        lattices.batch = batch
        lattices.h = h
        lattices.k = k
        cdef BatchPathsOut out
        out.tokens = &ot[0, 0, 0]
        out.score = &osc[0, 0]
        out.draft_score = &od[0, 0]
        out.lm_score = &ol[0, 0]
        out.count = &oc[0]
        out.pops = &op[0]
        out.transitions = &otr[0]
        with nogil:
            PBestBatch(self.model.get()[0], lattices, c_ptr, co_ptr, bos, p, alpha, threads, out)
        return out_tokens, out_score, out_draft, out_lm, out_count, out_pops, out_transitions


    def pbest_one(self, const int32_t[:, ::1] tokens, const float[:, ::1] scores,
                  const int32_t[::1] widths, const int32_t[::1] context, bint bos, int p,
                  double alpha, path_type):
        """Raw search of one lattice, straight to a list of path_type(tokens, score, draft,
        lm); the Python layer validates every argument first. context: the tokens that
        matter of the decoded prefix (maybe none)."""
        cdef LatticeView lattice
        lattice.tokens = &tokens[0, 0]
        lattice.scores = &scores[0, 0]
        lattice.widths = &widths[0]
        lattice.h = tokens.shape[0]
        lattice.k = tokens.shape[1]
        cdef int h = lattice.h
        cdef size_t c_size = context.shape[0]
        cdef const int32_t* c_ptr = &context[0] if c_size > 0 else NULL  # NULL: no context
        cdef vector[int32_t] out_tokens
        cdef vector[double] out_score, out_draft, out_lm
        out_tokens.resize(<size_t> p * h)
        out_score.resize(p)
        out_draft.resize(p)
        out_lm.resize(p)
        cdef PathsOut out
        out.tokens = out_tokens.data()
        out.score = out_score.data()
        out.draft_score = out_draft.data()
        out.lm_score = out_lm.data()
        cdef int n
        with nogil:
            n = PBestOne(self.model.get()[0], lattice, c_ptr, c_size, bos, p, alpha, out)
        cdef int r, d
        return [path_type(tuple([out_tokens[r * h + d] for d in range(h)]), out_score[r],
                          out_draft[r], out_lm[r]) for r in range(n)]


def checksum64(const unsigned char[::1] data):
    """The binary model format's checksum of a byte range (what its header stores for the
    bytes after the header); the tests and the fuzzer use it to craft files."""
    return Checksum64(<const char*> &data[0] if data.shape[0] > 0 else <const char*> "", data.shape[0])


def arpa_header(const unsigned char[::1] data, path):
    """(counts, header size in bytes) of the beginning of an ARPA text, or None when it ends
    before the header does (see ParseArpaHeader)."""
    cdef string source = _path_bytes(path)
    cdef vector[int64_t] counts
    cdef size_t header_end = 0
    cdef bool complete
    cdef const char* ptr = <const char*> &data[0] if data.shape[0] > 0 else <const char*> ""
    cdef size_t size = data.shape[0]
    with nogil:
        complete = ParseArpaHeader(ptr, size, source, &counts, &header_end)
    return (list(counts), header_end) if complete else None


def lattice_problem(const int32_t[:, :, ::1] tokens, const float[:, :, ::1] scores,
                    const int32_t[:, ::1] widths):
    """The first problem of a batch of lattices (shapes and widths already checked), as
    (kind, b, i, j), or None; only arcs below the width count. Kinds, checked in this order
    over the whole batch: 0 a negative token id, 1 a score that is NaN or infinite, 2 a
    token listed twice within one position (j is then its second arc, or -1 in a position
    wider than 32 arcs, which is checked by sorting)."""
    cdef Py_ssize_t nb = tokens.shape[0], h = tokens.shape[1], b, i, j, j2
    cdef int32_t w
    cdef vector[int32_t] row
    with nogil:
        for b in range(nb):
            for i in range(h):
                for j in range(widths[b, i]):
                    if tokens[b, i, j] < 0:
                        with gil:
                            return 0, b, i, j
        for b in range(nb):
            for i in range(h):
                for j in range(widths[b, i]):
                    if not isfinite(scores[b, i, j]):
                        with gil:
                            return 1, b, i, j
        for b in range(nb):
            for i in range(h):
                w = widths[b, i]
                if w <= 32:
                    for j in range(1, w):
                        for j2 in range(j):
                            if tokens[b, i, j] == tokens[b, i, j2]:
                                with gil:
                                    return 2, b, i, j
                else:
                    row.assign(&tokens[b, i, 0], &tokens[b, i, 0] + w)
                    sort(row.begin(), row.end())
                    for j in range(1, w):
                        if row[j] == row[j - 1]:
                            with gil:
                                return 2, b, i, -1
    return None


cdef _table_arrays(CountTable* table):
    """Copies a C++ count table into (prefix int64, word int32, count int64) arrays."""
    cdef size_t n = table.size()
    prefix = np.empty(n, dtype=np.int64)
    word = np.empty(n, dtype=np.int32)
    count = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] p = prefix
    cdef int32_t[::1] w = word
    cdef int64_t[::1] c = count
    if n > 0:
        memcpy(&p[0], table.prefix.data(), n * sizeof(int64_t))
        memcpy(&w[0], table.word.data(), n * sizeof(int32_t))
        memcpy(&c[0], table.count.data(), n * sizeof(int64_t))
    return prefix, word, count


def count_stream(const int32_t[::1] stream, int order, int64_t vocab_size, int32_t eos):
    """Per order k: (prefix, word, count) arrays of the sorted k-gram count table."""
    cdef vector[CountTable] tables
    cdef const int32_t* ptr = &stream[0] if stream.shape[0] > 0 else NULL
    cdef size_t n = stream.shape[0]
    with nogil:
        tables = CountStream(ptr, n, order, vocab_size, eos)
    out = []
    for k in range(tables.size()):
        out.append(_table_arrays(&tables[k]))
        tables[k].prefix.clear()
        tables[k].prefix.shrink_to_fit()
        tables[k].word.clear()
        tables[k].word.shrink_to_fit()
        tables[k].count.clear()
        tables[k].count.shrink_to_fit()
    return out


def merge_count_order(runs, prefix_maps, int64_t vocab_size, int64_t min_count, row_maps,
                      output_paths):
    """Merges one order of several runs (see MergeCountOrder).

    runs: (prefix, word, count, size) per run, each column an array or a raw file path;
    prefix_maps: per run None, an int64 array, or (raw file path, size); row_maps: per run
    None, an int64 array to fill, or a raw file path to write; output_paths: None to get
    (prefix, word, count) arrays back, or three raw file paths to write (returns the size).
    """
    cdef vector[CountTableView] views
    cdef vector[RowMap] c_prefix_maps
    cdef vector[RowMap] c_row_maps
    cdef CountTableView* view
    cdef RowMap* row_map
    cdef const int64_t[::1] p
    cdef const int32_t[::1] w
    cdef const int64_t[::1] c
    cdef int64_t[::1] m
    keep_alive = []
    n_runs = len(runs)
    views.resize(n_runs)
    c_prefix_maps.resize(n_runs)
    c_row_maps.resize(n_runs)
    for r, ((prefix, word, count, size), prefix_map, out_map) in enumerate(
            zip(runs, prefix_maps, row_maps)):
        view = &views[r]
        view.size = size
        if isinstance(prefix, str):
            view.prefix_path = _path_bytes(prefix)
            view.word_path = _path_bytes(word)
            view.count_path = _path_bytes(count)
        elif size > 0:
            p, w, c = prefix, word, count
            keep_alive.append((p, w, c))
            view.prefix, view.word, view.count = &p[0], &w[0], &c[0]
        row_map = &c_prefix_maps[r]
        if isinstance(prefix_map, tuple):
            row_map.path = _path_bytes(prefix_map[0])
            row_map.size = prefix_map[1]
        elif prefix_map is not None:
            m = prefix_map
            keep_alive.append(m)
            row_map.size = m.shape[0]
            row_map.rows = &m[0] if m.shape[0] > 0 else NULL  # empty: the run's table is too
        row_map = &c_row_maps[r]
        if isinstance(out_map, str):
            row_map.path = _path_bytes(out_map)
        elif out_map is not None and size > 0:
            m = out_map
            keep_alive.append(m)
            row_map.rows = &m[0]
            row_map.size = m.shape[0]
    cdef CountTable merged
    cdef CountTableOutput output
    cdef size_t n
    if output_paths is None:
        output.table = &merged
    else:
        output.prefix_path = _path_bytes(output_paths[0])
        output.word_path = _path_bytes(output_paths[1])
        output.count_path = _path_bytes(output_paths[2])
    with nogil:
        n = MergeCountOrder(views, c_prefix_maps, vocab_size, min_count, c_row_maps, output)
    if output_paths is None:
        return _table_arrays(&merged)
    return n


def format_arpa_lines(const unsigned char[::1] words, const int64_t[::1] word_offsets,
                      const int32_t[:, ::1] ids, const double[::1] log10_prob,
                      const double[::1] log10_backoff, const unsigned char[::1] show_backoff):
    """The ARPA lines of a block of n-grams, as UTF-8 bytes (see FormatArpaLines)."""
    cdef string out
    cdef size_t n = ids.shape[0]
    cdef int k = ids.shape[1]
    cdef size_t num_words = word_offsets.shape[0] - 1
    if n == 0:
        return b""
    with nogil:
        FormatArpaLines(<const char*> &words[0] if words.shape[0] > 0 else <const char*> "",
                        &word_offsets[0], num_words, &ids[0, 0], n, k, &log10_prob[0],
                        &log10_backoff[0], &show_backoff[0], &out)
    return out


cdef _int64_array(vector[int64_t]* values):
    out = np.empty(values.size(), dtype=np.int64)
    cdef int64_t[::1] o = out
    if values.size() > 0:
        memcpy(&o[0], values.data(), values.size() * sizeof(int64_t))
    return out


def parse_id_lines(const unsigned char[::1] data):
    """(ids int64, ids per line int64, first bad line or 0) of a block of token-id lines."""
    cdef vector[int64_t] ids
    cdef vector[int64_t] lengths
    cdef size_t bad
    cdef size_t n = data.shape[0]
    cdef const char* ptr = <const char*> &data[0] if n > 0 else <const char*> ""
    with nogil:
        ids.reserve(n // 4)
        bad = ParseIdLines(ptr, n, &ids, &lengths)
    return _int64_array(&ids), _int64_array(&lengths), bad


def lookup_children(const int64_t[::1] prefix, const int32_t[::1] word, size_t n_parents,
                    const int64_t[::1] query_parent, const int64_t[::1] query_word):
    """Rows of (parent, word) in a table sorted by (prefix, word); -1 where absent."""
    cdef size_t n = query_word.shape[0]
    out = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef size_t n_rows = word.shape[0]
    if n == 0:
        return out
    with nogil:
        LookupChildren(&prefix[0] if n_rows > 0 else NULL, &word[0] if n_rows > 0 else NULL,
                       n_rows, n_parents, &query_parent[0], &query_word[0], n, &o[0])
    return out


def release_free_memory():
    """Returns memory freed by worker threads to the operating system (see counting.h)."""
    with nogil:
        ReleaseFreeMemory()


include "_core_drafting.pxi"
