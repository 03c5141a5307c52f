// The heads-free search: the p most probable continuations of a text (continuations.h).
#include "latticekit/continuations.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "latticekit/errors.h"

namespace latticekit {
namespace {

// log(lam p_cache + (1 - lam) exp(static_logprob)), the static probability taken as at most 1.
double Mix(double lam, double p_cache, double static_logprob) {
  static_logprob = std::min(static_logprob, 0.0);
  if (p_cache == 0.0) return std::log1p(-lam) + static_logprob;
  return std::log(lam * p_cache + (1.0 - lam) * std::exp(static_logprob));
}

struct Child {
  int32_t token;
  double logprob;
  double static_logprob;  // NaN without a static model
};

// The next tokens after one context, most probable first, ties by token id: the cache's
// followers of the longest match, each scored lam p_cache + (1 - lam) p_static, merged with the
// static model's other tokens below vocab_size, scored (1 - lam) p_static; the order is the full
// sort's. Followers are scored lazily. Two cursors bound those not scored yet: by count (they
// follow the context at most as often as the next one by count), and along the static model's
// ranking (the walk: a follower it has not passed is at most as probable as the walk's next
// token, or <unk>'s when the model lacks it). A token is emitted once its score beats that
// bound; until then the cursor whose term dominates the bound moves: the next follower by count
// is scored, or the walk passes one token (scoring a follower it meets, queueing a static one).
//
// Reset() starts it over for another context, its vectors keeping their capacity: a search takes
// its Children from a per-thread arena (BestContinuations), so a warm thread allocates nothing
// per expanded node.
class Children {
 public:
  void Reset(const NGramCache &cache, KatzState *state, const int32_t *tail, size_t size, int longest,
             int64_t vocab_size, double uniform) {
    cache_ = &cache;
    state_ = state;
    vocab_size_ = vocab_size;
    uniform_ = uniform;
    lam_ = log_rest_ = total_ = 0.0;
    unk_ = -INFINITY;
    node_ = 0;
    followers_ = next_ = walk_ = next_static_ = 0;
    exhausted_ = false;
    front_token_ = 0;
    front_ = -INFINITY;
    scored_.clear();
    heap_.clear();
    statics_.clear();
    ranked_.clear();
    match = cache.Match(tail, size, longest, &node_);
    lam_ = cache.Weight(match);
    log_rest_ = std::log1p(-lam_);
    if (match > 0) {
      total_ = static_cast<double>(cache.Total(node_));
      followers_ = cache.NumFollowers(node_);
      scored_.assign(followers_, 0);
    }
    if (state_ != nullptr && followers_ > 0) unk_ = state_->Log10Prob(0) * kLn10;
    if (state_ != nullptr) Front();
  }

  int match = 0;

  // The r-th next token, or null past the last proposable one.
  const Child *Ranked(size_t r) {
    while (ranked_.size() <= r) {
      Child next;
      if (!Advance(&next)) return nullptr;
      ranked_.push_back(next);
    }
    return &ranked_[r];
  }

 private:
  struct Scored {  // a follower scored, waiting its turn: min-heap on (neg, token)
    double neg;
    int32_t token;
    double static_logprob;
    bool operator>(const Scored &o) const { return neg != o.neg ? neg > o.neg : token > o.token; }
  };

  void Score(size_t position, double static_logprob) {
    scored_[position] = 1;
    const NGramCache::Follower f = cache_->FollowerAt(node_, position);
    heap_.push_back({-Mix(lam_, f.count / total_, static_logprob), f.token,
                     state_ != nullptr ? static_logprob : NAN});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<Scored>());
  }

  // The walk's next token (front_token_, front_) or its end.
  void Front() {
    int64_t token;
    if (state_->Ranked(walk_, &token, &front_)) {
      front_token_ = token;
    } else {
      exhausted_ = true;
      front_ = -INFINITY;
    }
  }

  // The walk passes one token: a follower is scored (its static probability is the walk's), a
  // static token below the vocabulary queued; the front moves on.
  void Walk() {
    const int64_t at = followers_ > 0 && front_token_ >= INT32_MIN && front_token_ <= INT32_MAX
                           ? cache_->Position(node_, static_cast<int32_t>(front_token_))
                           : -1;
    if (at >= 0) {
      if (!scored_[at]) Score(static_cast<size_t>(at), front_);
    } else if (front_token_ < vocab_size_) {
      statics_.push_back({static_cast<int32_t>(front_token_), front_, front_});
    }
    ++walk_;
    Front();
  }

  bool Advance(Child *out) {
    while (true) {
      if (state_ != nullptr) {  // the static candidate: the first queued, else the walk's next
        while (next_static_ == statics_.size() && !exhausted_) Walk();
      }
      const bool has_static = next_static_ < statics_.size();
      const Scored *cached = heap_.empty() ? nullptr : &heap_.front();
      bool take_static = false;
      double best = -INFINITY;
      if (has_static) {
        const Child &s = statics_[next_static_];
        const double score = log_rest_ + std::min(s.static_logprob, 0.0);
        take_static = cached == nullptr || -score < cached->neg || (-score == cached->neg && s.token < cached->token);
        best = take_static ? score : -cached->neg;
      } else if (cached != nullptr) {
        best = -cached->neg;
      }
      while (next_ < followers_ && scored_[next_]) ++next_;
      if (next_ < followers_) {  // could a follower not scored yet rank first?
        const double share = lam_ * (cache_->FollowerAt(node_, next_).count / total_);
        double rest;
        bool walk = false;
        if (state_ != nullptr) {
          rest = (1.0 - lam_) * std::exp(std::min(std::max(front_, unk_), 0.0));
          walk = !exhausted_ && front_ > unk_ && rest >= share;  // the walk's term dominates: move it
        } else {
          rest = (1.0 - lam_) * std::exp(std::min(uniform_, 0.0));
        }
        const double bound = std::log(share + rest);
        if (!(best > bound + 1e-12 * (1.0 + std::fabs(bound)))) {
          if (walk) Walk();
          else Score(next_, state_ != nullptr ? state_->LogProb(cache_->FollowerAt(node_, next_).token) : uniform_);
          continue;
        }
      }
      if (take_static) {
        const Child &s = statics_[next_static_++];
        *out = {s.token, best, s.static_logprob};
        return true;
      }
      if (cached == nullptr) return false;
      *out = {cached->token, -cached->neg, cached->static_logprob};
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<Scored>());
      heap_.pop_back();
      return true;
    }
  }

  const NGramCache *cache_ = nullptr;
  KatzState *state_ = nullptr;
  int64_t vocab_size_ = 0;
  double uniform_ = 0.0, lam_ = 0.0, log_rest_ = 0.0, total_ = 0.0, unk_ = -INFINITY;
  uint32_t node_ = 0;
  size_t followers_ = 0, next_ = 0;  // next_: the first follower by count not scored yet
  std::vector<uint8_t> scored_;
  std::vector<Scored> heap_;
  size_t walk_ = 0;  // the static model's ranked tokens passed
  bool exhausted_ = false;
  int64_t front_token_ = 0;
  double front_ = -INFINITY;   // the walk's next token's log-probability
  std::vector<Child> statics_;  // static tokens the walk passed, in its order (logprob unused)
  size_t next_static_ = 0;
  std::vector<Child> ranked_;
};

// A search entry: a node to add (rank >= 0: its parent's rank-th child) or the bound of a
// node's children (rank -1, parent: the node), ordered as the reference's tuples
// (-score, token path, parent, rank).
struct Entry {
  double neg;
  uint32_t path, length;  // the token path: paths[path .. path + length)
  int32_t parent, rank;
};

}  // namespace

void BestContinuations(const NGramCache &cache, const KatzSuccessors *static_model, KatzStateMemo *states,
                       int64_t vocab_size, const int32_t *tail, size_t size, int p, int max_depth,
                       Continuations *out) {
  if (p < 1 || max_depth < 1 || vocab_size < 1)
    throw InvalidArgument("p, max_depth and vocab_size must be >= 1, got " + std::to_string(p) + ", " +
                          std::to_string(max_depth) + ", " + std::to_string(vocab_size));
  *out = Continuations();
  const size_t keep = static_cast<size_t>(std::max(cache.max_order(), static_model ? static_model->order() - 1 : 0));
  const size_t root_size = std::min(size, keep);
  const std::vector<int32_t> root_tail(tail + (size - root_size), tail + size);
  const double uniform = -std::log(static_cast<double>(vocab_size));
  KatzStateMemo own(0);  // without the request's memo: one for this search
  if (static_model != nullptr) {
    if (states == nullptr) states = &own;
    states->Start(*static_model);
  }
  // The thread's Children, reused search after search (their vectors keep their capacity); the
  // arena only grows, to the most nodes one search expanded.
  static thread_local std::vector<std::unique_ptr<Children>> arena;
  size_t used = 0;
  auto children = [&](const int32_t *t, size_t n, int longest) -> Children * {
    KatzState *state = static_model != nullptr ? states->Get(t, n) : nullptr;
    if (used == arena.size()) arena.emplace_back(new Children());
    Children *c = arena[used++].get();
    c->Reset(cache, state, t, n, longest, vocab_size, uniform);
    return c;
  };

  std::vector<int32_t> paths;  // every entry's token path
  std::vector<Entry> heap;
  auto later = [&](const Entry &a, const Entry &b) {  // a after b: the max-heap's "less"
    if (a.neg != b.neg) return a.neg > b.neg;
    const int32_t *pa = paths.data() + a.path, *pb = paths.data() + b.path;
    if (std::lexicographical_compare(pa, pa + a.length, pb, pb + b.length)) return false;
    if (std::lexicographical_compare(pb, pb + b.length, pa, pa + a.length)) return true;
    if (a.parent != b.parent) return a.parent > b.parent;
    return a.rank > b.rank;
  };
  std::vector<Children *> expanded;  // per node, its children once its bound was popped
  std::vector<int> bounds;           // per node, a bound on its match: its parent's plus one
  std::vector<uint32_t> node_path;   // per node, where its path starts in paths
  Children *root = children(root_tail.data(), root_tail.size(), cache.max_order());

  auto push_child = [&](int32_t parent, int32_t rank) {
    Children *of = parent < 0 ? root : expanded[parent];
    const Child *child = of->Ranked(static_cast<size_t>(rank));
    if (child == nullptr) return;
    const double base = parent >= 0 ? out->score[parent] : 0.0;
    const uint32_t length = parent >= 0 ? static_cast<uint32_t>(out->depths[parent]) : 0;
    const uint32_t at = static_cast<uint32_t>(paths.size());
    paths.reserve(paths.size() + length + 1);  // no reallocation while the parent's path is copied
    for (uint32_t j = 0; j < length; ++j) paths.push_back(paths[node_path[parent] + j]);
    paths.push_back(child->token);
    heap.push_back({-(base + child->logprob), at, length + 1, parent, rank});
    std::push_heap(heap.begin(), heap.end(), later);
  };

  std::vector<int32_t> scratch;
  push_child(-1, 0);
  while (!heap.empty() && out->tokens.size() < static_cast<size_t>(p)) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Entry e = heap.back();
    heap.pop_back();
    if (e.rank < 0) {  // the bound of a node's children: read its distribution now
      const int32_t node = e.parent;
      scratch.assign(root_tail.begin(), root_tail.end());  // its tail: the text's and its path's last tokens
      scratch.insert(scratch.end(), paths.begin() + e.path, paths.begin() + e.path + e.length);
      const size_t n = std::min(scratch.size(), keep);
      expanded[node] = children(scratch.data() + (scratch.size() - n), n, bounds[node]);
      push_child(node, 0);
      continue;
    }
    Children *of = e.parent < 0 ? root : expanded[e.parent];
    const Child child = *of->Ranked(static_cast<size_t>(e.rank));
    const int32_t node = static_cast<int32_t>(out->tokens.size());
    out->tokens.push_back(child.token);
    out->parents.push_back(e.parent);
    out->depths.push_back(static_cast<int32_t>(e.length));
    out->logprob.push_back(child.logprob);
    out->static_logprob.push_back(child.static_logprob);
    out->score.push_back(-e.neg);
    node_path.push_back(e.path);
    bounds.push_back(of->match + 1);
    expanded.push_back(nullptr);
    push_child(e.parent, e.rank + 1);
    if (e.length < static_cast<uint32_t>(max_depth)) {
      heap.push_back({e.neg, e.path, e.length, node, -1});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
}

void TrieConditionals(const NGramCache &cache, const KatzSuccessors *static_model, KatzStateMemo *states,
                      int64_t vocab_size, const int32_t *tail, size_t size, const int32_t *parents,
                      const int32_t *tokens, size_t n, double *logprob, double *static_logprob) {
  if (vocab_size < 1) throw InvalidArgument("vocab_size must be >= 1, got " + std::to_string(vocab_size));
  for (size_t i = 0; i < n; ++i)
    if (parents[i] < -1 || parents[i] >= static_cast<int64_t>(i))
      throw InvalidArgument("node " + std::to_string(i) + "'s parent " + std::to_string(parents[i]) +
                            " is not an earlier node or -1");
  const size_t keep = static_cast<size_t>(std::max(cache.max_order(), static_model ? static_model->order() - 1 : 0));
  const size_t root_size = std::min(size, keep);
  const double uniform = -std::log(static_cast<double>(vocab_size));
  KatzStateMemo own(0);
  if (static_model != nullptr) {
    if (states == nullptr) states = &own;
    states->Start(*static_model);
  }
  // context[i]: the last keep tokens of tail + the path to node i (the context of i's children)
  std::vector<int32_t> contexts;
  std::vector<uint32_t> begin(n + 1), length(n + 1);  // [n]: the root's, tail's last tokens
  begin[n] = 0;
  length[n] = static_cast<uint32_t>(root_size);
  contexts.assign(tail + (size - root_size), tail + size);
  for (size_t i = 0; i < n; ++i) {
    const size_t up = parents[i] < 0 ? n : static_cast<size_t>(parents[i]);
    const int32_t *ctx = contexts.data() + begin[up];
    const size_t len = length[up];
    const int32_t token = tokens[i];
    KatzState *state = static_model != nullptr ? states->Get(ctx, len) : nullptr;
    const double stat = state != nullptr ? state->LogProb(token) : uniform;
    static_logprob[i] = state != nullptr ? stat : NAN;
    const int match = cache.Match(ctx, len, cache.max_order());
    if (match == 0) {
      logprob[i] = std::min(stat, 0.0);
    } else {
      const uint32_t node = cache.Context(ctx, len, match);
      const int64_t at = cache.Position(node, token);
      const double count = at >= 0 ? cache.FollowerAt(node, static_cast<size_t>(at)).count : 0.0;
      logprob[i] = Mix(cache.Weight(match), count / cache.Total(node), stat);
    }
    // node i's own context, for its children: its parent's, one token longer, at most keep
    const size_t drop = len + 1 > keep ? len + 1 - keep : 0;
    const uint32_t at = static_cast<uint32_t>(contexts.size());
    contexts.reserve(contexts.size() + len + 1 - drop);
    for (size_t j = begin[up] + drop; j < begin[up] + len; ++j) contexts.push_back(contexts[j]);
    contexts.push_back(token);
    begin[i] = at;
    length[i] = static_cast<uint32_t>(len + 1 - drop);
  }
}

namespace {

void CheckParents(const ContinuationNodes &nodes, const char *which) {
  for (size_t i = 0; i < nodes.size; ++i)
    if (nodes.parents[i] < -1 || nodes.parents[i] >= static_cast<int64_t>(i))
      throw InvalidArgument(std::string("UniteContinuations: ") + which + " node " + std::to_string(i) +
                            " has parent " + std::to_string(nodes.parents[i]) + ", not an earlier node or -1");
}

}  // namespace

void UniteContinuations(const ContinuationNodes &found, const ContinuationNodes &recalled, int64_t text_bit,
                        int64_t memory_bit, std::vector<int64_t> *tokens, std::vector<int64_t> *parents,
                        std::vector<int64_t> *depths, std::vector<double> *logprob,
                        std::vector<double> *static_logprob, std::vector<double> *score,
                        std::vector<int64_t> *sources) {
  CheckParents(found, "text");
  CheckParents(recalled, "memory");
  const size_t most = found.size + recalled.size;
  tokens->assign(found.tokens, found.tokens + found.size);
  parents->assign(found.parents, found.parents + found.size);
  depths->assign(found.depths, found.depths + found.size);
  logprob->assign(found.logprob, found.logprob + found.size);
  static_logprob->assign(found.static_logprob, found.static_logprob + found.size);
  sources->assign(found.size, text_bit);
  for (auto *v : {tokens, parents, depths, sources}) v->reserve(most);
  logprob->reserve(most);
  static_logprob->reserve(most);
  // children[parent + 1]: the united tree's nodes under parent, as a linked list (the trees
  // are small: a parent's children are searched one by one)
  std::vector<int64_t> first(most + 1, -1), next(most, -1), last(most + 1, -1);
  auto link = [&](int64_t parent, int64_t node) {
    int64_t &tail = last[parent + 1];
    if (tail < 0) first[parent + 1] = node; else next[tail] = node;
    tail = node;
  };
  for (size_t i = 0; i < found.size; ++i) link(found.parents[i], static_cast<int64_t>(i));
  std::vector<int64_t> placed(recalled.size);
  for (size_t r = 0; r < recalled.size; ++r) {
    const int64_t parent = recalled.parents[r] >= 0 ? placed[recalled.parents[r]] : -1;
    const int64_t token = recalled.tokens[r];
    int64_t node = first[parent + 1];
    while (node >= 0 && (*tokens)[node] != token) node = next[node];
    if (node < 0) {
      node = static_cast<int64_t>(tokens->size());
      tokens->push_back(token);
      parents->push_back(parent);
      depths->push_back(recalled.depths[r]);
      logprob->push_back(recalled.logprob[r]);
      static_logprob->push_back(std::numeric_limits<double>::quiet_NaN());
      sources->push_back(memory_bit);
      link(parent, node);
    } else {
      (*logprob)[node] = std::max((*logprob)[node], recalled.logprob[r]);
      (*sources)[node] |= memory_bit;
    }
    placed[r] = node;
  }
  score->resize(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i)
    (*score)[i] = ((*parents)[i] >= 0 ? (*score)[(*parents)[i]] : 0.0) + (*logprob)[i];
}

void UniteLatticePaths(const int32_t *paths, size_t num_paths, size_t length, int64_t heads_bit,
                       const int64_t *found_tokens, const int64_t *found_parents, const int64_t *found_sources,
                       size_t found_size, const LatticeView &lattice, std::vector<int64_t> *tokens,
                       std::vector<int64_t> *parents, std::vector<int64_t> *depths, std::vector<int64_t> *sources,
                       std::vector<double> *head) {
  for (size_t i = 0; i < found_size; ++i)
    if (found_parents[i] < -1 || found_parents[i] >= static_cast<int64_t>(i))
      throw InvalidArgument("UniteLatticePaths: text node " + std::to_string(i) + " has parent " +
                            std::to_string(found_parents[i]) + ", not an earlier node or -1");
  const size_t most = num_paths * length + found_size;
  for (auto *v : {tokens, parents, depths, sources}) {
    v->clear();
    v->reserve(most);
  }
  // children[parent + 1]: the tree's nodes under parent, as a linked list (the trees are small:
  // a parent's children are searched one by one)
  std::vector<int64_t> first(most + 1, -1), next(most, -1), last(most + 1, -1);
  // the node under parent holding token, made (with no sources yet) where there is none
  auto child = [&](int64_t parent, int64_t token) {
    int64_t node = first[parent + 1];
    while (node >= 0 && (*tokens)[node] != token) node = next[node];
    if (node >= 0) return node;
    node = static_cast<int64_t>(tokens->size());
    tokens->push_back(token);
    parents->push_back(parent);
    depths->push_back(parent >= 0 ? (*depths)[parent] + 1 : 1);
    sources->push_back(0);
    int64_t &tail = last[parent + 1];
    if (tail < 0) first[parent + 1] = node; else next[tail] = node;
    tail = node;
    return node;
  };
  for (size_t r = 0; r < num_paths; ++r) {
    int64_t node = -1;
    for (size_t j = 0; j < length; ++j) {
      node = child(node, paths[r * length + j]);
      (*sources)[node] |= heads_bit;
    }
  }
  std::vector<int64_t> placed(found_size);
  for (size_t i = 0; i < found_size; ++i) {
    placed[i] = child(found_parents[i] >= 0 ? placed[found_parents[i]] : -1, found_tokens[i]);
    for (int64_t up = placed[i]; up >= 0; up = (*parents)[up]) (*sources)[up] |= found_sources[i];
  }
  const size_t n = tokens->size();
  head->assign(n, std::numeric_limits<double>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) {
    const int64_t depth = (*depths)[i];
    if (depth >= lattice.h) continue;
    const size_t row = static_cast<size_t>(depth) * static_cast<size_t>(lattice.k);
    for (int32_t a = 0; a < lattice.widths[depth]; ++a)
      if (lattice.tokens[row + a] == (*tokens)[i]) {
        (*head)[i] = lattice.scores[row + a];
        break;
      }
  }
}

}  // namespace latticekit
