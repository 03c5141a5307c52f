// The n-gram cache of one request's text (ngram_cache.h).
#include "latticekit/ngram_cache.h"

#include <algorithm>
#include <string>

#include "latticekit/errors.h"

namespace latticekit {

NGramCache::NGramCache(int max_order, const double *prior, double prior_positions)
    : max_order_(max_order), prior_positions_(prior_positions) {
  if (max_order < 1) throw InvalidArgument("max_order must be >= 1, got " + std::to_string(max_order));
  prior_.assign(prior, prior + max_order);
  Clear();
}

void NGramCache::Clear() {
  responsibility_.assign(max_order_, 0.0);
  positions_.assign(max_order_, 0.0);
  text_.clear();
  text_.shrink_to_fit();
  segment_ = 0;
  nodes_.assign(1, Node());
  nodes_.shrink_to_fit();
  children_.Release();
  lists_.clear();
  lists_.shrink_to_fit();
  where_.Release();
}

double NGramCache::Weight(int n) const {
  if (n <= 0) return 0.0;
  const int i = std::min(n, max_order_) - 1;
  return (prior_positions_ * prior_[i] + responsibility_[i]) / (prior_positions_ + positions_[i]);
}

uint32_t NGramCache::Child(uint32_t node, int32_t token) const {
  const uint32_t *child = children_.Find(Key(node, token));
  return child != nullptr ? *child : 0;
}

int NGramCache::Match(const int32_t *tail, size_t size, int longest, uint32_t *node) const {
  const int most = static_cast<int>(std::min<size_t>({static_cast<size_t>(max_order_), size,
                                                      static_cast<size_t>(std::max(longest, 0))}));
  uint32_t at = 0;
  int n = 0;
  while (n < most) {
    const uint32_t child = Child(at, tail[size - 1 - n]);
    if (child == 0) break;
    at = child;
    ++n;
  }
  if (node != nullptr) *node = at;
  return n;
}

uint32_t NGramCache::Context(const int32_t *tail, size_t size, int n) const {
  uint32_t node = 0;
  for (int j = 0; j < n; ++j) node = Child(node, tail[size - 1 - j]);
  return node;
}

size_t NGramCache::NumFollowers(uint32_t node) const {
  const Node &nd = nodes_[node];
  if (nd.total == 0) return 0;
  return nd.list == kInline ? 1 : lists_[nd.list].size();
}

NGramCache::Follower NGramCache::FollowerAt(uint32_t node, size_t i) const {
  const Node &nd = nodes_[node];
  if (nd.list == kInline) return {nd.token, nd.total};
  return lists_[nd.list][i];
}

int64_t NGramCache::Position(uint32_t node, int32_t token) const {
  const Node &nd = nodes_[node];
  if (nd.total == 0) return -1;
  if (nd.list == kInline) return nd.token == token ? 0 : -1;
  const uint32_t *at = where_.Find(Key(nd.list, token));
  return at != nullptr ? static_cast<int64_t>(*at) : -1;
}

void NGramCache::Count(uint32_t node, int32_t token) {
  Node &nd = nodes_[node];
  if (nd.total == 0) {  // a new context
    nd.total = 1;
    nd.token = token;
    return;
  }
  ++nd.total;
  bool inserted;
  if (nd.list == kInline) {
    if (nd.token == token) return;
    // a second follower: the context gets a list
    nd.list = static_cast<uint32_t>(lists_.size());
    lists_.push_back({{nd.token, nd.total - 1}, {token, 1}});
    where_.FindOrInsert(Key(nd.list, nd.token), 0, &inserted);
    where_.FindOrInsert(Key(nd.list, token), 1, &inserted);
    return;
  }
  std::vector<Follower> &list = lists_[nd.list];
  const uint32_t at = *where_.FindOrInsert(Key(nd.list, token), static_cast<uint32_t>(list.size()), &inserted);
  if (inserted) {  // counts are >= 1: a newcomer's 1 keeps the list sorted at its end
    list.push_back({token, 1});
    return;
  }
  // The first follower with this count: swapped with the token, it takes count + 1 and the
  // list stays sorted by decreasing count.
  const uint32_t count = list[at].count;
  const uint32_t first = static_cast<uint32_t>(
      std::lower_bound(list.begin(), list.begin() + at, count,
                       [](const Follower &f, uint32_t c) { return f.count > c; }) - list.begin());
  if (first != at) {
    std::swap(list[first], list[at]);
    *where_.Find(Key(nd.list, list[at].token)) = at;
    *where_.Find(Key(nd.list, list[first].token)) = first;
  }
  ++list[first].count;
}

void NGramCache::Append(int32_t token) {
  text_.push_back(token);
  const size_t end = text_.size() - 1;
  const size_t most = std::min<size_t>(static_cast<size_t>(max_order_), end - segment_);
  uint32_t node = 0;
  bool inserted;
  for (size_t n = 1; n <= most; ++n) {
    const uint32_t fresh = static_cast<uint32_t>(nodes_.size());
    const uint32_t child = *children_.FindOrInsert(Key(node, text_[end - n]), fresh, &inserted);
    if (inserted) nodes_.emplace_back();
    node = child;
    Count(node, token);
  }
}

void NGramCache::Extend(const int32_t *tokens, const double *static_prob, size_t n) {
  text_.reserve(text_.size() + n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t token = tokens[i];
    const size_t size = text_.size();
    uint32_t node;
    const int match = Match(text_.data() + segment_, size - segment_, max_order_, &node);
    if (match > 0) {
      const int64_t at = Position(node, token);
      const double count = at >= 0 ? static_cast<double>(FollowerAt(node, static_cast<size_t>(at)).count) : 0.0;
      const double lam = Weight(match);
      const double p_cache = lam * count / static_cast<double>(nodes_[node].total);
      const double p_static = (1.0 - lam) * static_prob[i];
      if (p_cache + p_static > 0) {
        responsibility_[match - 1] += p_cache / (p_cache + p_static);
        positions_[match - 1] += 1;
      }
    }
    Append(token);
  }
}

size_t NGramCache::bytes() const {
  size_t total = text_.capacity() * sizeof(int32_t) + nodes_.capacity() * sizeof(Node) + children_.bytes() +
                 where_.bytes() + lists_.capacity() * sizeof(std::vector<Follower>);
  for (const auto &list : lists_) total += list.capacity() * sizeof(Follower);
  return total;
}

}  // namespace latticekit
