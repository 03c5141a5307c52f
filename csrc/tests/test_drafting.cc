// Unit tests of the heads-free drafting core: the n-gram
// cache's counts, order and weights against a recount of the whole text, the Katz successors
// against the model's own scores and a brute-force ranking, and the search's basic promises.
// test_core.cc's main runs them; tests/drafting checks the same code against the Python it
// replaced, on random models and texts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "latticekit/acceptance.h"
#include "latticekit/arpa.h"
#include "latticekit/continuations.h"
#include "latticekit/errors.h"
#include "latticekit/model.h"
#include "latticekit/ngram_cache.h"
#include "latticekit/search.h"
#include "latticekit/successors.h"

#include "check.h"

namespace latticekit {
namespace testing {
namespace {

void TestNGramCache() {
  const int max_order = 4;
  const std::vector<double> prior = {0.2, 0.4, 0.6, 0.8};
  NGramCache cache(max_order, prior.data(), 2.0);
  std::mt19937 rng(3);
  std::vector<int32_t> text;
  for (int i = 0; i < 3000; ++i) text.push_back(i > 50 && rng() % 3 == 0 ? text[i - 37] : static_cast<int32_t>(rng() % 40));
  const std::vector<double> uniform(text.size(), 1.0 / 40);
  cache.Extend(text.data(), uniform.data(), 1000);  // in two pieces
  cache.Extend(text.data() + 1000, uniform.data() + 1000, text.size() - 1000);
  CHECK(cache.text() == text);
  std::map<std::vector<int32_t>, std::map<int32_t, uint32_t>> recount;
  for (size_t end = 1; end < text.size(); ++end)
    for (size_t n = 1; n <= std::min<size_t>(max_order, end); ++n)
      ++recount[std::vector<int32_t>(text.begin() + (end - n), text.begin() + end)][text[end]];
  bool counts = true, sorted = true, match = true;
  for (const auto &kv : recount) {
    const std::vector<int32_t> &context = kv.first;
    const int n = static_cast<int>(context.size());
    match = match && cache.Match(context.data(), context.size(), max_order) == n;
    const uint32_t node = cache.Context(context.data(), context.size(), n);
    uint32_t total = 0;
    std::map<int32_t, uint32_t> got;
    for (size_t i = 0; i < cache.NumFollowers(node); ++i) {
      const NGramCache::Follower f = cache.FollowerAt(node, i);
      got[f.token] = f.count;
      total += f.count;
      if (i > 0) sorted = sorted && cache.FollowerAt(node, i - 1).count >= f.count;
      counts = counts && cache.Position(node, f.token) == static_cast<int64_t>(i);
    }
    counts = counts && got == kv.second && total == cache.Total(node);
  }
  CHECK(counts);
  CHECK(sorted);
  CHECK(match);
  const int32_t unseen[] = {41, 42};
  CHECK(cache.Match(unseen, 2, max_order) == 0);
  CHECK(cache.Match(text.data(), 100, 2) == 2 && cache.Match(text.data(), 100, 9) == max_order);  // at most longest
  double sum = 0;
  for (double p : cache.positions()) sum += p;
  CHECK(sum > 0 && sum <= text.size() - 1);
  CHECK(cache.Weight(0) == 0.0);
  CHECK_NEAR(cache.Weight(9), (2.0 * 0.8 + cache.responsibility()[3]) / (2.0 + cache.positions()[3]), 1e-15);
  cache.Clear();
  CHECK(cache.text().empty() && cache.num_contexts() == 0 && cache.Weight(1) == 0.2);
  CHECK_THROWS(InvalidArgument, (void)NGramCache(0, prior.data(), 1.0), [](const InvalidArgument &) {});
}

using Recount = std::map<std::vector<int32_t>, std::map<int32_t, uint32_t>>;

// Whether the cache holds every recounted context, matched whole, with exactly its followers.
bool CountsMatch(const NGramCache &cache, const Recount &recount, int max_order) {
  bool counts = true;
  for (const auto &kv : recount) {
    const std::vector<int32_t> &context = kv.first;
    const uint32_t node = cache.Context(context.data(), context.size(), static_cast<int>(context.size()));
    std::map<int32_t, uint32_t> got;
    for (size_t i = 0; i < cache.NumFollowers(node); ++i) got[cache.FollowerAt(node, i).token] = cache.FollowerAt(node, i).count;
    counts = counts && cache.Match(context.data(), context.size(), max_order) == static_cast<int>(context.size()) &&
             got == kv.second;
  }
  return counts;
}

// Texts separated by Break: every context is counted within its own segment only (a recount
// per segment), and the weights are fitted on no position whose match reaches back past a break.
void TestNGramCacheSegments() {
  const int max_order = 3;
  const std::vector<double> prior = {0.2, 0.4, 0.6};
  NGramCache cache(max_order, prior.data(), 2.0);
  std::mt19937 rng(5);
  Recount recount;
  size_t fitted_most = 0;
  for (int s = 0; s < 40; ++s) {
    std::vector<int32_t> seg(rng() % 30);
    for (auto &t : seg) t = static_cast<int32_t>(rng() % 6);
    const std::vector<double> uniform(seg.size(), 1.0 / 6);
    cache.Break();
    if (!seg.empty()) cache.Extend(seg.data(), uniform.data(), seg.size());
    for (size_t end = 1; end < seg.size(); ++end)
      for (size_t n = 1; n <= std::min<size_t>(max_order, end); ++n)
        ++recount[std::vector<int32_t>(seg.begin() + (end - n), seg.begin() + end)][seg[end]];
    fitted_most += seg.empty() ? 0 : seg.size() - 1;
  }
  CHECK(CountsMatch(cache, recount, max_order));
  CHECK(cache.num_contexts() == recount.size());  // no context spans a break
  double sum = 0;
  for (double p : cache.positions()) sum += p;
  CHECK(sum <= fitted_most);  // a segment's first token is fitted on nothing before it
}

// Segments primed with a context (Prime): a segment's tokens are counted after contexts that
// reach back into its context but never past it, and the context's own tokens are neither
// counted nor fitted on (a recount per segment, the context's positions skipped).
void TestNGramCachePrime() {
  const int max_order = 3;
  const std::vector<double> prior = {0.2, 0.4, 0.6};
  NGramCache cache(max_order, prior.data(), 2.0);
  std::mt19937 rng(11);
  Recount recount;
  size_t fitted_most = 0, held = 0;
  for (int s = 0; s < 40; ++s) {
    std::vector<int32_t> context(rng() % 5), seg(rng() % 20);
    for (auto &t : context) t = static_cast<int32_t>(rng() % 6);
    for (auto &t : seg) t = static_cast<int32_t>(rng() % 6);
    const std::vector<double> uniform(seg.size(), 1.0 / 6);
    cache.Prime(context.data(), context.size());
    if (!seg.empty()) cache.Extend(seg.data(), uniform.data(), seg.size());
    std::vector<int32_t> all(context);
    all.insert(all.end(), seg.begin(), seg.end());
    for (size_t end = context.size(); end < all.size(); ++end)  // the segment's tokens only
      for (size_t n = 1; n <= std::min<size_t>(max_order, end); ++n)
        ++recount[std::vector<int32_t>(all.begin() + (end - n), all.begin() + end)][all[end]];
    fitted_most += context.empty() && !seg.empty() ? seg.size() - 1 : seg.size();
    held += all.size();
  }
  CHECK(CountsMatch(cache, recount, max_order));
  CHECK(cache.num_contexts() == recount.size());  // no context is counted but these
  CHECK(cache.text().size() == held);
  double sum = 0;
  for (double p : cache.positions()) sum += p;
  CHECK(sum <= fitted_most);  // a context's tokens are fitted on never
  cache.Prime(nullptr, 0);  // an empty context: a break
  CHECK(cache.text().size() == held);
}

// A model over the token ids 0..4 (words spelled as decimals).
const char kIdArpa[] =
    "\\data\\\nngram 1=8\nngram 2=4\nngram 3=1\n\n"
    "\\1-grams:\n-1.5\t<unk>\n-99\t<s>\t-0.5\n-0.9\t</s>\n-0.6\t0\t-0.3\n-0.7\t1\t-0.2\n-0.7\t2\t0.1\n"
    "-1.1\t3\n-0.8\t4\t-0.4\n\n"
    "\\2-grams:\n-0.2\t0 1\t-0.1\n-0.4\t0 3\n-0.3\t1 0\n-0.1\t4 4\n\n"
    "\\3-grams:\n-0.05\t0 1 2\n\n\\end\\\n";

void TestSuccessors() {
  const std::string text = kIdArpa;
  std::unique_ptr<Model> model = Model::Build(ParseArpa(text.data(), text.size(), "id.arpa"), {}, false, "id.arpa");
  std::vector<int64_t> token_of(model->num_words(), -1);
  for (WordId w = 0; w < model->num_words(); ++w) {
    const std::string s = model->WordText(w);
    if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) token_of[w] = std::stoll(s);
  }
  KatzSuccessors index(*model, token_of.data(), token_of.size());
  const std::vector<std::vector<int32_t>> contexts = {{}, {0}, {0, 1}, {3, 0, 1}, {4}, {2, 4, 4}, {7, 9}};
  bool scores = true, ranks = true;
  for (const std::vector<int32_t> &context : contexts) {
    KatzState state(index, context.data(), context.size());
    const StateId s = model->ContextState(context.data(), context.size(), false);
    std::vector<std::pair<double, int64_t>> want;
    for (int32_t t = 0; t < 7; ++t) {
      double lp;
      model->Score(s, &t, 1, &lp, nullptr);
      scores = scores && state.LogProb(t) == lp * kLn10;
      if (t < 5) want.emplace_back(-lp * kLn10, t);
    }
    std::sort(want.begin(), want.end());
    for (size_t r = 0; r <= want.size(); ++r) {
      int64_t token;
      double logprob;
      const bool found = state.Ranked(r, &token, &logprob);
      ranks = ranks && (r == want.size() ? !found : found && token == want[r].second && logprob == -want[r].first);
    }
  }
  CHECK(scores);
  CHECK(ranks);
  CHECK_THROWS(InvalidArgument, (void)KatzSuccessors(*model, token_of.data(), token_of.size() - 1),
               [](const InvalidArgument &) {});

  // The search: "0 1" was followed by 2 twice; the first continuation copies it, every node's
  // parent comes first, scores only fall, and the conditionals add up.
  const std::vector<double> prior = {0.5, 0.6, 0.7};
  NGramCache cache(3, prior.data(), 1.0);
  const std::vector<int32_t> words = {0, 1, 2, 3, 0, 1, 2, 4, 0, 1};
  const std::vector<double> p(words.size(), 0.1);
  cache.Extend(words.data(), p.data(), words.size());
  const std::vector<const KatzSuccessors *> static_models = {nullptr, &index};
  for (const KatzSuccessors *static_model : static_models) {
    Continuations out;
    BestContinuations(cache, static_model, nullptr, 5, words.data(), words.size(), 12, 4, &out);
    // without a static model only the cache's followers are proposed: fewer than 12 here
    CHECK((static_model != nullptr ? out.tokens.size() == 12 : !out.tokens.empty() && out.tokens.size() < 12));
    CHECK(out.tokens[0] == 2 && out.parents[0] == -1);
    bool tree = true;
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      const int32_t parent = out.parents[i];
      tree = tree && parent < static_cast<int32_t>(i) && (i == 0 || out.score[i] <= out.score[i - 1]);
      tree = tree && out.depths[i] == (parent < 0 ? 1 : out.depths[parent] + 1) && out.depths[i] <= 4;
      tree = tree && std::fabs(out.score[i] - ((parent < 0 ? 0.0 : out.score[parent]) + out.logprob[i])) < 1e-12;
      tree = tree && (static_model == nullptr) == std::isnan(out.static_logprob[i]);
    }
    CHECK(tree);
  }
  Continuations out;
  CHECK_THROWS(InvalidArgument, BestContinuations(cache, &index, nullptr, 5, words.data(), words.size(), 0, 4, &out),
               [](const InvalidArgument &) {});
}

// Pending labels against labelling every node afresh: a node at depth d below root r is
// labelled once the text holds position r + d and each of its ancestors matches the text there,
// 1 if its own token does, and only once; a tree is kept while a node of it may still be labelled.
void TestPendingLabels() {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const int alphabet = 2 + static_cast<int>(rng() % 3);
    std::vector<int64_t> text(1 + rng() % 4);
    for (auto &t : text) t = static_cast<int64_t>(rng() % alphabet);
    PendingLabels pending;
    struct Reference {
      int64_t root;
      double step;  // its nodes' features: step * 100 + the node, twice
      std::vector<int64_t> tokens, parents, depths;
      std::vector<char> done;
    };
    std::vector<Reference> trees;
    for (int step = 0; step < 12; ++step) {
      Reference tree{static_cast<int64_t>(text.size()) - 1, static_cast<double>(step), {}, {}, {}, {}};
      // a trie, as the searches give: siblings' tokens differ
      for (size_t i = 0, wanted = 1 + rng() % 8; i < wanted; ++i) {
        const int64_t parent = static_cast<int64_t>(rng() % (tree.tokens.size() + 1)) - 1;
        const int64_t token = static_cast<int64_t>(rng() % alphabet);
        bool taken = false;
        for (size_t j = 0; j < tree.tokens.size(); ++j)
          taken = taken || (tree.parents[j] == parent && tree.tokens[j] == token);
        if (taken) continue;
        tree.parents.push_back(parent);
        tree.depths.push_back(parent < 0 ? 1 : tree.depths[static_cast<size_t>(parent)] + 1);
        tree.tokens.push_back(token);
      }
      const size_t n = tree.tokens.size();
      tree.done.assign(n, 0);
      std::vector<double> features(n * 2);
      for (size_t i = 0; i < n; ++i) features[2 * i] = features[2 * i + 1] = static_cast<double>(100 * step + i);
      pending.Add(tree.root, tree.tokens.data(), tree.parents.data(), n, features.data(), 2);
      trees.push_back(tree);
      for (size_t grow = rng() % 4; grow > 0; --grow) text.push_back(static_cast<int64_t>(rng() % alphabet));
      std::vector<double> got_features, got_labels, want_features, want_labels;
      const int64_t first = pending.Earliest();
      pending.Resolve(text.data() + first, first, text.size() - static_cast<size_t>(first), &got_features,
                      &got_labels);
      std::vector<Reference> kept;
      for (Reference &r : trees) {
        const int64_t known = static_cast<int64_t>(text.size()) - 1 - r.root;
        std::vector<char> possible(r.tokens.size()), matched(r.tokens.size());
        bool waiting = false;
        for (size_t i = 0; i < r.tokens.size(); ++i) {
          const int64_t parent = r.parents[i];
          const size_t up = static_cast<size_t>(std::max<int64_t>(parent, 0));
          possible[i] = parent < 0 || (possible[up] && (r.depths[up] > known || matched[up]));
          if (!possible[i] || r.depths[i] > known) {
            waiting = waiting || (possible[i] && !r.done[i]);
            continue;
          }
          matched[i] = r.tokens[i] == text[static_cast<size_t>(r.root + r.depths[i])];
          if (!r.done[i]) {
            r.done[i] = 1;
            want_features.insert(want_features.end(), 2, 100.0 * r.step + static_cast<double>(i));
            want_labels.push_back(matched[i] ? 1.0 : 0.0);
          }
        }
        if (waiting) kept.push_back(r);
      }
      trees = kept;
      CHECK(got_labels == want_labels);
      CHECK(got_features == want_features);
      CHECK(pending.size() == trees.size());
    }
  }
  PendingLabels pending;
  const int64_t tokens[] = {1, 2}, bad_parents[] = {-1, 1};
  const double features[] = {0, 0};
  bool thrown = false;
  try {
    pending.Add(0, tokens, bad_parents, 2, features, 1);
  } catch (const InvalidArgument &) {
    thrown = true;
  }
  CHECK(thrown);
}

// The heads' paths and the text's continuations in one trie: the order of first appearance, the
// sources of every candidate through a node, the head scores at each node's depth.
void TestUniteLatticePaths() {
  // a lattice of 3 positions (0 the root) of 2 arcs, position 2 one arc wide
  const int32_t lattice_tokens[] = {9, 0, 4, 5, 6, 7};
  const float lattice_scores[] = {0.0f, 0.0f, -0.5f, -1.0f, -0.25f, -3.0f};
  const int32_t widths[] = {1, 2, 1};
  LatticeView lattice;
  lattice.tokens = lattice_tokens;
  lattice.scores = lattice_scores;
  lattice.widths = widths;
  lattice.h = 3;
  lattice.k = 2;
  const int32_t paths[] = {4, 6, 5, 6};  // two paths of 2 tokens
  // the text's tree: 4 (the paths' first node), 4 7 (7 past position 2's width), 8, 8 6 6 (past the lattice)
  const int64_t found_tokens[] = {4, 7, 8, 6, 6}, found_parents[] = {-1, 0, -1, 2, 3}, found_sources[] = {2, 6, 2, 2, 4};
  std::vector<int64_t> tokens, parents, depths, sources;
  std::vector<double> head;
  UniteLatticePaths(paths, 2, 2, 1, found_tokens, found_parents, found_sources, 5, lattice, &tokens, &parents, &depths,
                    &sources, &head);
  CHECK((tokens == std::vector<int64_t>{4, 6, 5, 6, 7, 8, 6, 6}));
  CHECK((parents == std::vector<int64_t>{-1, 0, -1, 2, 0, -1, 5, 6}));
  CHECK((depths == std::vector<int64_t>{1, 2, 1, 2, 2, 1, 2, 3}));
  // node 0 is on both paths' heads and under the text's 4 and 4 7 (text, memory)
  CHECK((sources == std::vector<int64_t>{7, 1, 1, 1, 6, 6, 6, 4}));
  CHECK(head[0] == -0.5 && head[1] == -0.25 && head[2] == -1.0 && head[3] == -0.25 && head[6] == -0.25);
  CHECK(std::isnan(head[4]) && std::isnan(head[5]) && std::isnan(head[7]));
  const int64_t bad_parents[] = {-1, 1};
  CHECK_THROWS(InvalidArgument,
               UniteLatticePaths(paths, 0, 2, 1, found_tokens, bad_parents, found_sources, 2, lattice, &tokens,
                                 &parents, &depths, &sources, &head),
               [](const InvalidArgument &e) { CHECK(std::string(e.what()).find("text node 1") != std::string::npos); });
}

}  // namespace

void TestDrafting() {
  TestNGramCache();
  TestNGramCacheSegments();
  TestNGramCachePrime();
  TestSuccessors();
  TestPendingLabels();
  TestUniteLatticePaths();
}

}  // namespace testing
}  // namespace latticekit
