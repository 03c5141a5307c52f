// The n-gram cache of one request's text (latticekit/drafting/cache_model.py documents the
// model it serves): for every context of 1..max_order tokens of the text, the tokens that
// followed it and how often, and the statistics of the interpolation weights lam(n) fitted on
// the text as it grows. Appending a token costs O(max_order) hash-table steps, whatever the
// text's length; nothing is ever re-read.
//
// The contexts form a trie read backwards (a context's parent is the context one token shorter
// on the left, i.e. its suffix), so the longest context ending a text that the cache has seen
// followed by a token is one walk down from the root, and the contexts a token is counted after
// are the walk's nodes. A context's followers are kept sorted by decreasing count (an increment
// swaps the token with the first of its count), so the search (continuations.h) can read the
// most frequent first and bound the rest. A context followed by one token so far (most long
// ones) holds it inline.
#ifndef LATTICEKIT_NGRAM_CACHE_H_
#define LATTICEKIT_NGRAM_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "latticekit/open_map.h"

namespace latticekit {

class NGramCache {
 public:
  struct Follower {
    int32_t token;
    uint32_t count;
  };

  // prior[n - 1]: lam(n) before any evidence, n = 1..max_order; prior_positions: how many
  // positions the prior weighs. Throws InvalidArgument for max_order < 1.
  NGramCache(int max_order, const double *prior, double prior_positions);

  int max_order() const { return max_order_; }
  const std::vector<int32_t> &text() const { return text_; }
  // Forgets the text, the counts and the weights' statistics.
  void Clear();

  // Appends tokens. At each, first the weights' statistics: where the text so far has a match
  // of n tokens, the posterior that the cache produced the token (lam(n) p_cache over
  // lam(n) p_cache + (1 - lam(n)) static_prob[i]) is added to lam(n)'s; then the token is
  // counted after each of its 1..max_order preceding contexts.
  void Extend(const int32_t *tokens, const double *static_prob, size_t n);
  // Ends a segment of the text: no later token is counted after, or fitted on, a context that
  // reaches back past this point (several texts in one cache, such as the answers of an
  // AnswerMemory, never run into each other). Clear starts one segment.
  void Break() { segment_ = text_.size(); }
  // Starts a segment, as Break, whose first n tokens are context only: neither counted nor
  // fitted on, but the tokens Extend appends next are counted (and fitted) after contexts that
  // reach back into them. An AnswerMemory primes each answer with its prompt's last tokens, so
  // that the answer's first tokens are counted after the turn that led to them.
  void Prime(const int32_t *tokens, size_t n) {
    Break();
    text_.insert(text_.end(), tokens, tokens + n);
  }

  // lam(n): the cache's share for a match of n tokens (0 for n <= 0).
  double Weight(int n) const;
  // The length n of the longest context ending tail[0 .. size) seen followed by a token, at most
  // min(max_order, size, longest); 0 for none. node, when given, receives its context's node.
  int Match(const int32_t *tail, size_t size, int longest, uint32_t *node = nullptr) const;
  // The node of the context of tail's last n tokens (n at most Match's), 0 (the root) for n = 0.
  uint32_t Context(const int32_t *tail, size_t size, int n) const;

  // A context's followers, by decreasing count (ties in no fixed order), and their sum.
  uint32_t Total(uint32_t node) const { return nodes_[node].total; }
  size_t NumFollowers(uint32_t node) const;
  Follower FollowerAt(uint32_t node, size_t i) const;
  // Where token sits among the context's followers, or -1.
  int64_t Position(uint32_t node, int32_t token) const;

  std::vector<double> &responsibility() { return responsibility_; }  // sum of posteriors per n
  std::vector<double> &positions() { return positions_; }            // positions seen per n
  const std::vector<double> &responsibility() const { return responsibility_; }
  const std::vector<double> &positions() const { return positions_; }
  size_t num_contexts() const { return nodes_.size() - 1; }
  size_t bytes() const;

 private:
  static constexpr uint32_t kInline = 0xFFFFFFFFu;
  struct Node {
    uint32_t total = 0;
    int32_t token = 0;         // the one follower while list is kInline
    uint32_t list = kInline;   // else its followers: lists_[list]
  };
  static uint64_t Key(uint32_t owner, int32_t token) {
    return (static_cast<uint64_t>(owner) << 32) | static_cast<uint32_t>(token);
  }
  uint32_t Child(uint32_t node, int32_t token) const;  // 0: none
  void Count(uint32_t node, int32_t token);
  void Append(int32_t token);

  int max_order_;
  std::vector<double> prior_;
  double prior_positions_;
  std::vector<double> responsibility_, positions_;
  std::vector<int32_t> text_;
  size_t segment_ = 0;                          // where the text's last segment starts
  std::vector<Node> nodes_;                     // nodes_[0]: the empty context
  internal::OpenMap<uint64_t> children_{16};    // (node, token on the left) -> node
  std::vector<std::vector<Follower>> lists_;    // followers of contexts with several
  internal::OpenMap<uint64_t> where_{16};       // (list, token) -> position in it
};

}  // namespace latticekit

#endif  // LATTICEKIT_NGRAM_CACHE_H_
