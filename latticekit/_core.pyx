# cython: language_level=3, boundscheck=False, wraparound=False
"""Private binding of the C++ core. Users import latticekit, never this module.

Arrays cross as typed memoryviews, validated by the Python layer; every compute call runs
without the GIL.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.utility cimport move
from libcpp.vector cimport vector

from latticekit._cpp cimport (Model, NGramTables, OrderTable, ParseArpa, PBestBatch,
                              StateId)


cdef string _path_bytes(path):
    return str(path).encode("utf-8")


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

    def save(self, path):
        cdef string c_path = _path_bytes(path)
        with nogil:
            self.model.get().Save(c_path)

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
        """Raw batched search; the Python layer validates every argument first."""
        cdef int64_t batch = tokens.shape[0]
        cdef int h = tokens.shape[1]
        cdef int k = tokens.shape[2]
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
        cdef double[:, ::1] os = out_score
        cdef double[:, ::1] od = out_draft
        cdef double[:, ::1] ol = out_lm
        cdef int32_t[::1] oc = out_count
        cdef int64_t[::1] op = out_pops
        cdef int64_t[::1] otr = out_transitions
        cdef const int32_t[:, ::1] w_view
        cdef const int32_t* w_ptr = NULL
        if widths is not None:
            w_view = widths
            w_ptr = &w_view[0, 0]
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
        with nogil:
            PBestBatch(self.model.get()[0], &tokens[0, 0, 0], &scores[0, 0, 0], w_ptr, batch, h, k,
                       c_ptr, co_ptr, bos, p, alpha, threads, &ot[0, 0, 0], &os[0, 0], &od[0, 0],
                       &ol[0, 0], &oc[0], &op[0], &otr[0])
        return out_tokens, out_score, out_draft, out_lm, out_count, out_pops, out_transitions
