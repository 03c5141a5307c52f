# The drafting core's part of the binding (included by _core.pyx): a request's n-gram cache, a
# model's ranked successors, the search of the most probable continuations and the acceptance
# model's update (csrc/latticekit/ngram_cache.h, successors.h, continuations.h, acceptance.h).
# latticekit/drafting validates the arguments; the C++ calls run without the GIL.

cdef class CoreKatzSuccessors:
    """The ranked next tokens of one model (successors.h); keeps the model alive."""

    def __cinit__(self, CoreModel model, const int64_t[::1] token_of):
        self.model = model
        cdef const int64_t* ptr = &token_of[0] if token_of.shape[0] > 0 else NULL
        cdef size_t n = token_of.shape[0]
        with nogil:
            self.index.reset(new KatzSuccessors(model.model.get()[0], ptr, n))

    def state(self, const int32_t[::1] context):
        """The model after ``context`` (its last order - 1 tokens)."""
        cdef CoreKatzState out = CoreKatzState.__new__(CoreKatzState)
        out.successors = self
        cdef size_t n = context.shape[0]
        out.state.reset(new KatzState(self.index.get()[0], &context[0] if n > 0 else NULL, n))
        return out

    @property
    def bytes(self):
        return int(self.index.get().bytes())


cdef class CoreKatzState:
    """The model after one context (successors.h's KatzState)."""

    def logprob(self, int64_t token):
        return self.state.get().LogProb(token)

    def ranked(self, size_t r):
        cdef int64_t token
        cdef double logprob
        if self.state.get().Ranked(r, &token, &logprob):
            return int(token), logprob
        return None


cdef _doubles(const vector[double]& values):
    out = np.empty(values.size(), dtype=np.float64)
    cdef double[::1] o = out
    if values.size() > 0:
        memcpy(&o[0], values.data(), values.size() * sizeof(double))
    return out


cdef _int64s(const vector[int32_t]& values):
    out = np.empty(values.size(), dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef size_t i
    for i in range(values.size()):
        o[i] = values[i]
    return out


cdef _copy_into(vector[double]& target, const double[::1] values):
    if <size_t> values.shape[0] != target.size():
        raise ValueError(f"{target.size()} values needed, got {values.shape[0]}")
    cdef size_t i
    for i in range(target.size()):
        target[i] = values[i]


# The static model's states a request's searches keep (successors.h's KatzStateMemo): a step's
# candidate tree visits about 30 contexts, most of them again at the next steps.
cdef size_t STATES_KEPT = 1024


cdef class CoreNGramCache:
    """One request's n-gram cache (ngram_cache.h), and the static model's states its searches
    keep."""

    def __cinit__(self, int max_order, const double[::1] prior, double prior_positions):
        if prior.shape[0] < max_order:
            raise ValueError(f"prior needs {max_order} weights, got {prior.shape[0]}")
        self.cache.reset(new NGramCache(max_order, &prior[0] if prior.shape[0] > 0 else NULL, prior_positions))
        self.states.reset(new KatzStateMemo(STATES_KEPT))

    def __len__(self):
        return self.cache.get().text().size()

    def clear(self):
        self.cache.get().Clear()

    def extend(self, const int32_t[::1] tokens, const double[::1] static_prob):
        """Appends tokens (static_prob: the static model's probability of each where it stands)."""
        cdef size_t n = tokens.shape[0]
        if <size_t> static_prob.shape[0] != n:
            raise ValueError(f"{n} tokens and {static_prob.shape[0]} static probabilities")
        if n == 0:
            return
        with nogil:
            self.cache.get().Extend(&tokens[0], &static_prob[0], n)

    def break_segment(self):
        """Ends a segment: later tokens' contexts never reach back past it (ngram_cache.h)."""
        self.cache.get().Break()

    def prime(self, const int32_t[::1] tokens):
        """Starts a segment whose first tokens are context only: not counted, but the next
        tokens' contexts reach back into them (ngram_cache.h)."""
        cdef size_t n = tokens.shape[0]
        self.cache.get().Prime(&tokens[0] if n > 0 else NULL, n)

    def weight(self, int n):
        return self.cache.get().Weight(n)

    def match(self, const int32_t[::1] tail, int longest):
        cdef size_t n = tail.shape[0]
        return self.cache.get().Match(&tail[0] if n > 0 else NULL, n, longest)

    def followers(self, const int32_t[::1] tail, int n):
        """({token: count}, total) after the last n tokens of tail (n at most its match)."""
        cdef NGramCache* cache = self.cache.get()
        cdef size_t size = tail.shape[0]
        cdef uint32_t node = cache.Context(&tail[0] if size > 0 else NULL, size, n)
        cdef size_t i
        cdef NGramCacheFollower f
        counts = {}
        for i in range(cache.NumFollowers(node)):
            f = cache.FollowerAt(node, i)
            counts[f.token] = f.count
        return counts, cache.Total(node)

    def count(self, const int32_t[::1] tail, int n, int64_t token):
        """(count of token, total) after the last n tokens of tail (n at most its match)."""
        cdef NGramCache* cache = self.cache.get()
        cdef size_t size = tail.shape[0]
        cdef uint32_t node = cache.Context(&tail[0] if size > 0 else NULL, size, n)
        cdef int64_t at = cache.Position(node, <int32_t> token) if -2**31 <= token < 2**31 else -1
        return (cache.FollowerAt(node, at).count if at >= 0 else 0), cache.Total(node)

    @property
    def responsibility(self):
        return _doubles(self.cache.get().responsibility())

    @responsibility.setter
    def responsibility(self, const double[::1] values):
        _copy_into(self.cache.get().responsibility(), values)

    @property
    def positions(self):
        return _doubles(self.cache.get().positions())

    @positions.setter
    def positions(self, const double[::1] values):
        _copy_into(self.cache.get().positions(), values)

    @property
    def num_contexts(self):
        return int(self.cache.get().num_contexts())

    @property
    def bytes(self):
        return int(self.cache.get().bytes())

    cdef const KatzSuccessors* _index(self, CoreKatzSuccessors successors):
        """The static model's index; the memo's states forgotten when they are another model's."""
        if successors is None:
            return NULL
        if successors is not self.states_of:
            self.states.reset(new KatzStateMemo(STATES_KEPT))
            self.states_of = successors
        return successors.index.get()

    def best_continuations(self, const int32_t[::1] tail, CoreKatzSuccessors successors, int64_t vocab_size,
                           int p, int max_depth):
        """(tokens, parents, depths, logprob, static_logprob, score) of the p best continuations."""
        cdef Continuations out
        cdef const KatzSuccessors* index = self._index(successors)
        cdef size_t size = tail.shape[0]
        cdef const int32_t* ptr = &tail[0] if size > 0 else NULL
        with nogil:
            BestContinuations(self.cache.get()[0], index, self.states.get(), vocab_size, ptr, size, p, max_depth,
                              &out)
        return (_int64s(out.tokens), _int64s(out.parents), _int64s(out.depths), _doubles(out.logprob),
                _doubles(out.static_logprob), _doubles(out.score))

    def trie_conditionals(self, const int32_t[::1] tail, CoreKatzSuccessors successors, int64_t vocab_size,
                          const int32_t[::1] parents, const int32_t[::1] tokens):
        """(logprob, static_logprob) of every node of a trie after tail (continuations.h)."""
        cdef size_t n = tokens.shape[0]
        if <size_t> parents.shape[0] != n:
            raise ValueError(f"{n} tokens and {parents.shape[0]} parents")
        logprob = np.empty(n, dtype=np.float64)
        static_logprob = np.empty(n, dtype=np.float64)
        if n == 0:
            return logprob, static_logprob
        cdef double[::1] lp = logprob
        cdef double[::1] sp = static_logprob
        cdef const KatzSuccessors* index = self._index(successors)
        cdef size_t size = tail.shape[0]
        cdef const int32_t* ptr = &tail[0] if size > 0 else NULL
        with nogil:
            TrieConditionals(self.cache.get()[0], index, self.states.get(), vocab_size, ptr, size, &parents[0],
                             &tokens[0], n, &lp[0], &sp[0])
        return logprob, static_logprob


def logistic_sgd(const double[:, ::1] x, const double[::1] y, double rate, double[::1] w):
    """One logistic-loss SGD step per row of x, in order, on w (in place); shapes checked by the caller."""
    if x.shape[0] == 0:
        return
    with nogil:
        LogisticSgd(&x[0, 0], &y[0], x.shape[0], x.shape[1], rate, &w[0])


def source_sgd(const double[:, ::1] x, const double[::1] y, const int64_t[::1] sources, const int64_t[::1] bits,
               const double[::1] rates, list weights):
    """Per model, one logistic-loss SGD step per row of x its sources count for (acceptance.h's
    SourceSgd), on its weights (in place); the rows each model counted. Shapes checked here."""
    cdef size_t rows = x.shape[0], cols = x.shape[1], models = bits.shape[0], m
    if <size_t> y.shape[0] != rows or <size_t> sources.shape[0] != rows or <size_t> rates.shape[0] != models \
            or <size_t> len(weights) != models:
        raise ValueError(f"source_sgd: {rows} rows, {y.shape[0]} labels, {sources.shape[0]} sources; {models} models, "
                         f"{rates.shape[0]} rates, {len(weights)} weight vectors")
    cdef vector[double*] w
    cdef double[::1] view
    for m in range(models):
        view = weights[m]
        if <size_t> view.shape[0] != cols:
            raise ValueError(f"source_sgd: weights of {view.shape[0]} for rows of {cols}")
        w.push_back(&view[0])
    counts = np.zeros(models, dtype=np.int64)
    if rows == 0:
        return counts
    cdef int64_t[::1] c = counts
    with nogil:
        SourceSgd(&x[0, 0], &y[0], &sources[0], rows, cols, models, &bits[0], &rates[0], w.data(), &c[0])
    return counts


cdef ContinuationNodes _nodes(const int64_t[::1] tokens, const int64_t[::1] parents, const int64_t[::1] depths,
                              const double[::1] logprob, const double[::1] static_logprob, str which) except *:
    cdef size_t n = tokens.shape[0]
    if <size_t> parents.shape[0] != n or <size_t> depths.shape[0] != n or <size_t> logprob.shape[0] != n \
            or <size_t> static_logprob.shape[0] != n:
        raise ValueError(f"{which}: {n} tokens, {parents.shape[0]} parents, {depths.shape[0]} depths, "
                         f"{logprob.shape[0]} and {static_logprob.shape[0]} log-probabilities")
    cdef ContinuationNodes out
    out.size = n
    out.tokens = &tokens[0] if n > 0 else NULL
    out.parents = &parents[0] if n > 0 else NULL
    out.depths = &depths[0] if n > 0 else NULL
    out.logprob = &logprob[0] if n > 0 else NULL
    out.static_logprob = &static_logprob[0] if n > 0 else NULL
    return out


def unite_continuations(found, recalled, int64_t text_bit, int64_t memory_bit):
    """(tokens, parents, depths, logprob, static_logprob, score, sources) of two searches' nodes in
    one tree (continuations.h's UniteContinuations); found and recalled are (tokens, parents,
    depths, logprob, static_logprob) of int64 and float64 arrays."""
    cdef ContinuationNodes a = _nodes(found[0], found[1], found[2], found[3], found[4], "text")
    cdef ContinuationNodes b = _nodes(recalled[0], recalled[1], recalled[2], recalled[3], recalled[4], "memory")
    cdef vector[int64_t] tokens, parents, depths, sources
    cdef vector[double] logprob, static_logprob, score
    with nogil:
        UniteContinuations(a, b, text_bit, memory_bit, &tokens, &parents, &depths, &logprob, &static_logprob,
                           &score, &sources)
    return (_int64_array(&tokens), _int64_array(&parents), _int64_array(&depths), _doubles(logprob),
            _doubles(static_logprob), _doubles(score), _int64_array(&sources))


def unite_lattice_paths(const int32_t[:, ::1] paths, int64_t heads_bit, const int64_t[::1] found_tokens,
                        const int64_t[::1] found_parents, const int64_t[::1] found_sources,
                        const int32_t[:, ::1] lattice_tokens, const float[:, ::1] lattice_scores,
                        const int32_t[::1] lattice_widths):
    """(tokens, parents, depths, sources, head) of the heads' best paths (rows of ``paths``) and
    the text's continuations in one tree (continuations.h's UniteLatticePaths), over a lattice
    of lattice_tokens' shape (h, k) whose widths lie in 1..k."""
    cdef size_t n = found_tokens.shape[0], i
    cdef size_t h = lattice_tokens.shape[0], k = lattice_tokens.shape[1]
    if <size_t> found_parents.shape[0] != n or <size_t> found_sources.shape[0] != n:
        raise ValueError(f"unite_lattice_paths: {n} tokens, {found_parents.shape[0]} parents and "
                         f"{found_sources.shape[0]} sources")
    if <size_t> lattice_scores.shape[0] != h or <size_t> lattice_scores.shape[1] != k \
            or <size_t> lattice_widths.shape[0] != h or h == 0 or k == 0:
        raise ValueError(f"unite_lattice_paths: a lattice of {h} x {k} tokens, {lattice_scores.shape[0]} x "
                         f"{lattice_scores.shape[1]} scores and {lattice_widths.shape[0]} widths")
    for i in range(h):
        if lattice_widths[i] < 1 or <size_t> lattice_widths[i] > k:
            raise ValueError(f"unite_lattice_paths: width {lattice_widths[i]} at position {i}, not in 1..{k}")
    cdef LatticeView lattice
    lattice.tokens, lattice.scores, lattice.widths = &lattice_tokens[0, 0], &lattice_scores[0, 0], &lattice_widths[0]
    lattice.h, lattice.k = h, k
    cdef size_t num_paths = paths.shape[0], length = paths.shape[1]
    cdef const int32_t* path_ptr = &paths[0, 0] if num_paths > 0 and length > 0 else NULL
    cdef const int64_t* tokens_ptr = &found_tokens[0] if n > 0 else NULL
    cdef const int64_t* parents_ptr = &found_parents[0] if n > 0 else NULL
    cdef const int64_t* sources_ptr = &found_sources[0] if n > 0 else NULL
    cdef vector[int64_t] tokens, parents, depths, sources
    cdef vector[double] head
    with nogil:
        UniteLatticePaths(path_ptr, num_paths if length > 0 else 0, length, heads_bit, tokens_ptr, parents_ptr,
                          sources_ptr, n, lattice, &tokens, &parents, &depths, &sources, &head)
    return (_int64_array(&tokens), _int64_array(&parents), _int64_array(&depths), _int64_array(&sources),
            _doubles(head))


def tree_chain(const int64_t[::1] parents, const int64_t[::1] depths, const double[::1] head,
               const double[::1] ngram, const double[::1] cache, const int64_t[::1] sources,
               const double[:, ::1] weights, const int64_t[::1] bits, size_t max_depth):
    """(features, probability, chain) of a candidate tree (acceptance.h's TreeChain): features
    `(n, max_depth + 4)`, the last column the node's sources."""
    cdef size_t n = parents.shape[0]
    if <size_t> depths.shape[0] != n or <size_t> head.shape[0] != n or <size_t> ngram.shape[0] != n \
            or <size_t> cache.shape[0] != n or <size_t> sources.shape[0] != n:
        raise ValueError(f"tree_chain: {n} parents, {depths.shape[0]} depths, {head.shape[0]}, {ngram.shape[0]} "
                         f"and {cache.shape[0]} log-probabilities, {sources.shape[0]} sources")
    if max_depth < 1 or <size_t> weights.shape[1] != max_depth + 3 or weights.shape[0] != bits.shape[0] \
            or weights.shape[0] < 1:
        raise ValueError(f"tree_chain: weights of shape ({weights.shape[0]}, {weights.shape[1]}) for "
                         f"{bits.shape[0]} models and max_depth {max_depth}")
    features = np.empty((n, max_depth + 4), dtype=np.float64)
    probability = np.empty(n, dtype=np.float64)
    cdef vector[int64_t] chain
    if n == 0:
        return features, probability, np.zeros(0, dtype=np.int64)
    cdef double[:, ::1] f = features
    cdef double[::1] pr = probability
    with nogil:
        TreeChain(n, &parents[0], &depths[0], &head[0], &ngram[0], &cache[0], &sources[0], weights.shape[0],
                  &weights[0, 0], &bits[0], max_depth, &f[0, 0], &pr[0], &chain)
    return features, probability, _int64_array(&chain)


cdef void _widened(const vector[int32_t]& values, vector[int64_t]* out) noexcept nogil:
    out.resize(values.size())
    cdef size_t i
    for i in range(values.size()):
        out[0][i] = values[i]


cdef class CorePendingLabels:
    """Candidate trees waiting for the decoded text to reach their nodes (acceptance.h's
    PendingLabels; calibration.py's PendingLabels reads it)."""

    cdef PendingLabels labels

    def add(self, int64_t root, const int64_t[::1] tokens, const int64_t[::1] parents, const double[:, ::1] features):
        """A tree of len(tokens) nodes below text position root, each node's features a row."""
        cdef size_t n = tokens.shape[0]
        if <size_t> parents.shape[0] != n or <size_t> features.shape[0] != n:
            raise ValueError(f"PendingLabels: {n} tokens, {parents.shape[0]} parents and {features.shape[0]} rows of "
                             "features")
        if n == 0:
            return
        self.labels.Add(root, &tokens[0], &parents[0], n, &features[0, 0] if features.shape[1] > 0 else NULL,
                        features.shape[1])

    def resolve(self, const int64_t[::1] text, int64_t first):
        """(features, labels) of every node the text (its first token at position first) now
        decides: features `(labelled, width)`."""
        cdef vector[double] features, labels
        cdef size_t size = text.shape[0]
        cdef size_t width = self.labels.width()
        self.labels.Resolve(&text[0] if size > 0 else NULL, first, size, &features, &labels)
        if labels.size() == 0:
            return np.zeros((0, 0)), np.zeros(0)
        return _doubles(features).reshape(labels.size(), width), _doubles(labels)

    @property
    def earliest(self):
        """The earliest text position a tree's labels read (its root + 1), or -1 with none held."""
        return self.labels.Earliest()

    def __len__(self):
        return self.labels.size()


def chain_candidates(CoreNGramCache text, const int32_t[::1] text_tail, CoreKatzSuccessors successors,
                     int64_t vocab_size, CoreNGramCache memory, const int32_t[::1] memory_tail,
                     int64_t memory_vocab_size, int p, int max_depth, const double[:, ::1] weights,
                     const int64_t[::1] bits, size_t acceptance_depth, int64_t text_bit, int64_t memory_bit,
                     CorePendingLabels pending, int64_t root, bint with_sources):
    """One request's step in one call: the text's p best continuations (BestContinuations),
    united with the memory's where ``memory`` is given and holds any (UniteContinuations), the
    tree's estimates and best chain (TreeChain, no head scores), and the tree added to
    ``pending`` below text position ``root`` with its nodes' features (their sources as a last
    column where ``with_sources``): what best_continuations, unite_continuations, tree_chain and
    PendingLabels.add give one after the other, with nothing in between crossing to Python.
    (the chain's tokens, each position's probability). The caller holds the memory's lock."""
    if acceptance_depth < 1 or <size_t> weights.shape[1] != acceptance_depth + 3 \
            or weights.shape[0] != bits.shape[0] or weights.shape[0] < 1:
        raise ValueError(f"chain_candidates: weights of shape ({weights.shape[0]}, {weights.shape[1]}) for "
                         f"{bits.shape[0]} models and max_depth {acceptance_depth}")
    cdef Continuations found, recalled
    cdef ContinuationNodes a, b
    cdef vector[int64_t] found_tokens, found_parents, found_depths, recalled_tokens, recalled_parents, recalled_depths
    cdef vector[int64_t] tokens, parents, depths, sources, chain
    cdef vector[double] logprob, static_logprob, score, head, features, probability
    cdef const KatzSuccessors* index = text._index(successors)
    cdef size_t size = text_tail.shape[0], memory_size = memory_tail.shape[0], n, i, j
    cdef size_t stride = acceptance_depth + 4, width = stride if with_sources else stride - 1
    cdef const int32_t* ptr = &text_tail[0] if size > 0 else NULL
    cdef const int32_t* memory_ptr = &memory_tail[0] if memory_size > 0 else NULL
    cdef const double* cache_lp
    cdef const double* static_lp
    with nogil:
        BestContinuations(text.cache.get()[0], index, text.states.get(), vocab_size, ptr, size, p, max_depth, &found)
        _widened(found.tokens, &found_tokens)
        _widened(found.parents, &found_parents)
        _widened(found.depths, &found_depths)
    if memory is not None:
        with nogil:
            BestContinuations(memory.cache.get()[0], NULL, memory.states.get(), memory_vocab_size, memory_ptr,
                              memory_size, p, max_depth, &recalled)
    with nogil:
        if recalled.tokens.size() > 0:
            _widened(recalled.tokens, &recalled_tokens)
            _widened(recalled.parents, &recalled_parents)
            _widened(recalled.depths, &recalled_depths)
            a.size, a.tokens, a.parents, a.depths = found_tokens.size(), found_tokens.data(), \
                found_parents.data(), found_depths.data()
            a.logprob, a.static_logprob = found.logprob.data(), found.static_logprob.data()
            b.size, b.tokens, b.parents, b.depths = recalled_tokens.size(), recalled_tokens.data(), \
                recalled_parents.data(), recalled_depths.data()
            b.logprob, b.static_logprob = recalled.logprob.data(), recalled.static_logprob.data()
            UniteContinuations(a, b, text_bit, memory_bit, &tokens, &parents, &depths, &logprob, &static_logprob,
                               &score, &sources)
            cache_lp, static_lp = logprob.data(), static_logprob.data()
        else:  # the text's nodes alone
            tokens.swap(found_tokens)
            parents.swap(found_parents)
            depths.swap(found_depths)
            sources.assign(tokens.size(), text_bit)
            cache_lp, static_lp = found.logprob.data(), found.static_logprob.data()
        n = tokens.size()
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    with nogil:
        head.assign(n, NAN)
        features.resize(n * stride)
        probability.resize(n)
        TreeChain(n, parents.data(), depths.data(), head.data(), static_lp, cache_lp, sources.data(),
                  weights.shape[0], &weights[0, 0], &bits[0], acceptance_depth, features.data(), probability.data(),
                  &chain)
        if not with_sources:  # rows without their last column, packed in place
            for i in range(1, n):
                for j in range(width):
                    features[i * width + j] = features[i * stride + j]
    pending.labels.Add(root, tokens.data(), parents.data(), n, features.data(), width)
    out_tokens = np.empty(chain.size(), dtype=np.int64)
    out_probability = np.empty(chain.size(), dtype=np.float64)
    cdef int64_t[::1] ot = out_tokens
    cdef double[::1] op = out_probability
    for i in range(chain.size()):
        ot[i] = tokens[<size_t> chain[i]]
        op[i] = probability[<size_t> chain[i]]
    return out_tokens, out_probability
