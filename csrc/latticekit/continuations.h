// The p most probable continuations of a text under the heads-free drafting model, as a tree:
// the search of latticekit/drafting/continuations.py (whose docstring describes it), over the
// request's n-gram cache (ngram_cache.h) interpolated with a Katz model (successors.h):
//
//   P(w | text) = lam(n) P_cache(w | the longest match, n tokens) + (1 - lam(n)) min(1, P_static(w | text)).
//
// A best-first search over token sequences pops nodes in decreasing probability; a popped node
// pushes its next sibling and a bound for its children, expanded only when popped. The next
// tokens after one context come lazily, most probable first, as a merge of the cache's followers
// and the static model's ranked tokens; a context followed by thousands of tokens costs only
// the followers that could still rank first: they are read by decreasing count, and one is
// scored only while its bound (its count's share plus the static probability that no unread
// follower can exceed) is not below the best candidate. Ties break as the reference's do, by
// token sequence (search) and token id (siblings), so the result equals it exactly.
#ifndef LATTICEKIT_CONTINUATIONS_H_
#define LATTICEKIT_CONTINUATIONS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "latticekit/ngram_cache.h"
#include "latticekit/search.h"
#include "latticekit/successors.h"

namespace latticekit {

// The nodes found, best first (parents before children); natural logs.
struct Continuations {
  std::vector<int32_t> tokens, parents, depths;  // parents: -1 under the root
  std::vector<double> logprob;         // the node's conditional under the interpolated model
  std::vector<double> static_logprob;  // under the static model alone (NaN without one)
  std::vector<double> score;           // the path's log-probability
};

// The p most probable continuations of 1..max_depth tokens after tail (the text's last tokens:
// its last max(max_order, order - 1) matter). static_model null: the uniform distribution over
// vocab_size instead, which proposes nothing of its own. Static tokens at or above vocab_size
// are never proposed. states: the request's memo of the static model's states (null: none kept
// beyond this search). Throws InvalidArgument for p < 1, max_depth < 1 or vocab_size < 1.
void BestContinuations(const NGramCache &cache, const KatzSuccessors *static_model, KatzStateMemo *states,
                       int64_t vocab_size, const int32_t *tail, size_t size, int p, int max_depth,
                       Continuations *out);

// The same model's conditionals at every node of a token trie after tail (parents before
// children, -1 under the root): logprob[i] = log P(tokens[i] | tail, the path to i's parent)
// under the interpolated model, static_logprob[i] under the static model alone (NaN without
// one); node by node what CacheModel.conditional gives (a candidate tree's nodes that the search
// did not propose: the heads' paths). states as above. Throws InvalidArgument for a parent that
// is not an earlier node or -1, or vocab_size < 1.
void TrieConditionals(const NGramCache &cache, const KatzSuccessors *static_model, KatzStateMemo *states,
                      int64_t vocab_size, const int32_t *tail, size_t size, const int32_t *parents,
                      const int32_t *tokens, size_t n, double *logprob, double *static_logprob);

// One tree of two searches' nodes (memory.py's united_with_memory is the reference): the
// text's (found: nf nodes, parents before children, -1 under the root) first as they are, then
// the memory's (recalled: nr nodes) that found lacks, placed under their parents' places in the
// united tree, parents before children. A node both hold takes the larger of its two
// conditionals; a node only the memory holds has NaN as its static log-probability; scores are
// the sums of the conditionals down each path. sources: each node's bits, text_bit for found's,
// memory_bit for recalled's (both for a node both hold). Throws InvalidArgument for a parent
// out of order in either tree.
struct ContinuationNodes {
  const int64_t *tokens, *parents, *depths;
  const double *logprob, *static_logprob;  // static_logprob: unread for the memory's nodes
  size_t size;
};
void UniteContinuations(const ContinuationNodes &found, const ContinuationNodes &recalled, int64_t text_bit,
                        int64_t memory_bit, std::vector<int64_t> *tokens, std::vector<int64_t> *parents,
                        std::vector<int64_t> *depths, std::vector<double> *logprob,
                        std::vector<double> *static_logprob, std::vector<double> *score,
                        std::vector<int64_t> *sources);

// One candidate tree of the heads' lattice and the text's continuations (union.py's
// united_candidates, written out with CandidateTree.from_paths and SausageLattice.arc_scores,
// is the reference): the lattice's best paths (num_paths rows of length tokens below the root,
// best first) merged into a trie, nodes in order of first appearance, then the nodes of found
// (parents before children, -1 under the root) that the paths lack, under their parents'
// places, in found's order. sources: heads_bit on every node of a path, found_sources[i] on
// found node i's place and on every place above it (a node's sources are those of every
// candidate through it). depths: 1 under the root. head: each node's arc score at lattice
// position = its depth (within that position's width), NaN where its token is not among them
// or the depth is lattice.h or more. Throws InvalidArgument for a found parent out of order.
void UniteLatticePaths(const int32_t *paths, size_t num_paths, size_t length, int64_t heads_bit,
                       const int64_t *found_tokens, const int64_t *found_parents, const int64_t *found_sources,
                       size_t found_size, const LatticeView &lattice, std::vector<int64_t> *tokens,
                       std::vector<int64_t> *parents, std::vector<int64_t> *depths, std::vector<int64_t> *sources,
                       std::vector<double> *head);

}  // namespace latticekit

#endif  // LATTICEKIT_CONTINUATIONS_H_
