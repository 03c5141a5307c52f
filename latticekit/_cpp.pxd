# Declarations of the C++ core (csrc/latticekit/*.h), one block per header.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "latticekit/errors.h" namespace "latticekit" nogil:
    # ErrorInfo::Kind itself, by its C++ names (its values live in errors.h only).
    cdef enum ErrorKind "latticekit::ErrorInfo::Kind":
        kOther "latticekit::ErrorInfo::kOther"
        kArpa "latticekit::ErrorInfo::kArpa"
        kModelFile "latticekit::ErrorInfo::kModelFile"
        kInvalidArgument "latticekit::ErrorInfo::kInvalidArgument"
        kNoMemory "latticekit::ErrorInfo::kNoMemory"
        kFileSystem "latticekit::ErrorInfo::kFileSystem"
        kThreadStart "latticekit::ErrorInfo::kThreadStart"

    cdef cppclass ErrorInfo:
        ErrorKind kind
        string message
        string path
        long line
        int code
    ErrorInfo CurrentError()


# Called by Cython inside the C++ catch block of every `except +raise_core_error` call:
# turns the C++ exception being handled into the matching latticekit.errors class.
cdef inline int raise_core_error() except -1:
    cdef ErrorInfo info = CurrentError()
    from latticekit import errors
    message = info.message.decode("utf-8", "replace")
    if info.kind == kArpa:
        raise errors.ArpaFormatError(message, info.path.decode("utf-8", "replace"), info.line)
    if info.kind == kModelFile:
        raise errors.ModelFormatError(message)
    if info.kind == kInvalidArgument:
        raise errors.LatticeError(message)
    if info.kind == kNoMemory:
        raise errors.OutOfMemoryError(message)
    if info.kind == kFileSystem:
        raise errors.FileAccessError(message, info.path.decode("utf-8", "surrogateescape"), info.code)
    if info.kind == kThreadStart:
        raise errors.ThreadStartError(message, info.code)
    raise errors.LatticeKitError(f"internal error (a bug of latticekit's, please report it): {message}")


cdef extern from "latticekit/arpa.h" namespace "latticekit" nogil:
    cdef cppclass OrderTable:
        vector[int32_t] ids
        vector[float] log10_prob
        vector[float] log10_backoff
        vector[uint32_t] lines

    cdef cppclass NGramTables:
        vector[string] words
        vector[OrderTable] orders

    NGramTables ParseArpa(const char* data, size_t size, const string& path) except +raise_core_error
    bool ParseArpaHeader(const char* data, size_t size, const string& path, vector[int64_t]* counts,
                         size_t* header_end) except +raise_core_error
    void FormatArpaLines(const char* words, const int64_t* word_offsets, size_t num_words,
                         const int32_t* ids, size_t n, int k, const double* log10_prob,
                         const double* log10_backoff, const unsigned char* show_backoff,
                         string* out) except +raise_core_error


cdef extern from "latticekit/corpus.h" namespace "latticekit" nogil:
    size_t ParseIdLines(const char* data, size_t size, vector[int64_t]* ids,
                        vector[int64_t]* lengths)


cdef extern from "latticekit/counting.h" namespace "latticekit" nogil:
    cdef cppclass CountTable:
        vector[int64_t] prefix
        vector[int32_t] word
        vector[int64_t] count
        size_t size()

    cdef cppclass CountTableView:
        const int64_t* prefix
        const int32_t* word
        const int64_t* count
        string prefix_path
        string word_path
        string count_path
        size_t size

    cdef cppclass RowMap:
        int64_t* rows
        string path
        size_t size

    cdef cppclass CountTableOutput:
        string prefix_path
        string word_path
        string count_path
        CountTable* table

    vector[CountTable] CountStream(const int32_t* stream, size_t n, int order, int64_t vocab_size,
                                   int32_t eos) except +raise_core_error
    size_t MergeCountOrder(const vector[CountTableView]& runs, const vector[RowMap]& prefix_maps,
                           int64_t vocab_size, int64_t min_count, const vector[RowMap]& row_maps,
                           const CountTableOutput& output) except +raise_core_error
    void ReleaseFreeMemory()


cdef extern from "latticekit/trie.h" namespace "latticekit" nogil:
    void LookupChildren(const int64_t* prefix, const int32_t* word, size_t n_rows,
                        size_t n_parents, const int64_t* query_parent,
                        const int64_t* query_word, size_t n_queries, int64_t* rows)


cdef extern from "latticekit/model.h" namespace "latticekit" nogil:
    ctypedef uint32_t StateId
    ctypedef uint32_t WordId

    cdef cppclass Model:
        @staticmethod
        unique_ptr[Model] Build(NGramTables tables, const vector[string]& vocab, bool has_vocab,
                                const string& source) except +raise_core_error
        @staticmethod
        unique_ptr[Model] Load(const string& path) except +raise_core_error
        const char* image()

        int order()
        uint64_t count(int n)
        uint64_t num_words()
        uint64_t num_states()
        uint64_t num_arcs()
        uint64_t num_tokens()
        uint64_t size_bytes()
        bool has_vocab()
        WordId TokenToWord(int64_t token)
        StateId StartState(bool bos)
        double Score(StateId start, const int32_t* tokens, size_t n, double* per_token,
                     StateId* end)
        StateId ContextState(const int32_t* context, size_t n, bool bos)
        string WordText(WordId w)
        void NGrams(int n, int32_t* ids, float* log10_prob, float* log10_backoff)


cdef extern from "latticekit/storage.h" namespace "latticekit" nogil:
    uint64_t Checksum64(const char* data, size_t size)


cdef extern from "latticekit/search.h" namespace "latticekit" nogil:
    cdef cppclass LatticeView:
        const int32_t* tokens
        const float* scores
        const int32_t* widths
        int h
        int k

    cdef cppclass PathsOut:
        int32_t* tokens
        double* score
        double* draft_score
        double* lm_score

    int PBestOne(const Model& model, const LatticeView& lattice, const int32_t* context,
                 size_t context_size, bool bos, int p, double alpha,
                 const PathsOut& out) except +raise_core_error
    cdef cppclass LatticeBatchView:
        const int32_t* tokens
        const float* scores
        const int32_t* widths
        int64_t batch
        int h
        int k

    cdef cppclass BatchPathsOut:
        int32_t* tokens
        double* score
        double* draft_score
        double* lm_score
        int32_t* count
        int64_t* pops
        int64_t* transitions

    void PBestBatch(const Model& model, const LatticeBatchView& lattices, const int32_t* context,
                    const int64_t* context_offsets, bool bos, int p, double alpha, int threads,
                    const BatchPathsOut& out) except +raise_core_error


cdef extern from "latticekit/successors.h" namespace "latticekit" nogil:
    cdef cppclass KatzSuccessors:
        KatzSuccessors(const Model& model, const int64_t* token_of, size_t num_words) except +raise_core_error
        size_t bytes()

    cdef cppclass KatzState:
        KatzState(const KatzSuccessors& index, const int32_t* context, size_t n) except +raise_core_error
        double LogProb(int64_t token)
        bool Ranked(size_t r, int64_t* token, double* logprob) except +raise_core_error

    cdef cppclass KatzStateMemo:
        KatzStateMemo(size_t capacity)
        size_t size()


cdef extern from "latticekit/ngram_cache.h" namespace "latticekit" nogil:
    cdef cppclass NGramCacheFollower "latticekit::NGramCache::Follower":
        int32_t token
        uint32_t count

    cdef cppclass NGramCache:
        NGramCache(int max_order, const double* prior, double prior_positions) except +raise_core_error
        int max_order()
        const vector[int32_t]& text()
        void Clear()
        void Extend(const int32_t* tokens, const double* static_prob, size_t n) except +raise_core_error
        void Break()
        void Prime(const int32_t* tokens, size_t n) except +raise_core_error
        double Weight(int n)
        int Match(const int32_t* tail, size_t size, int longest)
        uint32_t Context(const int32_t* tail, size_t size, int n)
        uint32_t Total(uint32_t node)
        size_t NumFollowers(uint32_t node)
        NGramCacheFollower FollowerAt(uint32_t node, size_t i)
        int64_t Position(uint32_t node, int32_t token)
        vector[double]& responsibility()
        vector[double]& positions()
        size_t num_contexts()
        size_t bytes()


cdef extern from "latticekit/continuations.h" namespace "latticekit" nogil:
    cdef cppclass Continuations:
        vector[int32_t] tokens
        vector[int32_t] parents
        vector[int32_t] depths
        vector[double] logprob
        vector[double] static_logprob
        vector[double] score

    void BestContinuations(const NGramCache& cache, const KatzSuccessors* static_model, KatzStateMemo* states,
                           int64_t vocab_size, const int32_t* tail, size_t size, int p, int max_depth,
                           Continuations* out) except +raise_core_error
    void TrieConditionals(const NGramCache& cache, const KatzSuccessors* static_model, KatzStateMemo* states,
                          int64_t vocab_size, const int32_t* tail, size_t size, const int32_t* parents,
                          const int32_t* tokens, size_t n, double* logprob,
                          double* static_logprob) except +raise_core_error

    cdef cppclass ContinuationNodes:
        const int64_t* tokens
        const int64_t* parents
        const int64_t* depths
        const double* logprob
        const double* static_logprob
        size_t size

    void UniteContinuations(const ContinuationNodes& found, const ContinuationNodes& recalled, int64_t text_bit,
                            int64_t memory_bit, vector[int64_t]* tokens, vector[int64_t]* parents,
                            vector[int64_t]* depths, vector[double]* logprob, vector[double]* static_logprob,
                            vector[double]* score, vector[int64_t]* sources) except +raise_core_error
    void UniteLatticePaths(const int32_t* paths, size_t num_paths, size_t length, int64_t heads_bit,
                           const int64_t* found_tokens, const int64_t* found_parents, const int64_t* found_sources,
                           size_t found_size, const LatticeView& lattice, vector[int64_t]* tokens,
                           vector[int64_t]* parents, vector[int64_t]* depths, vector[int64_t]* sources,
                           vector[double]* head) except +raise_core_error


cdef extern from "latticekit/acceptance.h" namespace "latticekit" nogil:
    void LogisticSgd(const double* x, const double* y, size_t rows, size_t cols, double rate, double* w)
    void SourceSgd(const double* x, const double* y, const int64_t* sources, size_t rows, size_t cols, size_t models,
                   const int64_t* bits, const double* rates, double* const* weights, int64_t* counts)
    void TreeChain(size_t n, const int64_t* parents, const int64_t* depths, const double* head, const double* ngram,
                   const double* cache, const int64_t* sources, size_t models, const double* weights,
                   const int64_t* bits, size_t max_depth, double* features, double* probability,
                   vector[int64_t]* chain) except +raise_core_error
    cdef cppclass PendingLabels:
        void Add(int64_t root, const int64_t* tokens, const int64_t* parents, size_t n, const double* features,
                 size_t width) except +raise_core_error
        void Resolve(const int64_t* text, int64_t first, size_t size, vector[double]* features,
                     vector[double]* labels) except +raise_core_error
        size_t size()
        size_t width()
        int64_t Earliest()
