// Unit tests of the C++ core on a tiny golden ARPA model, without Python: parsing, scoring
// with back-off against hand-computed values, the binary format's round trip, arc lookup,
// the p-best search against brute-force enumeration, and the typed errors. Its main also runs
// the tests of the other files in csrc/tests (check.h names them).
//
// tests/test_cpp_units.py compiles the files in csrc/tests with the core's sources and runs
// them:
//
//     test_core SCRATCH_DIR
//
// It prints one line per failed check and exits non-zero when any failed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "latticekit/arc_lookup.h"
#include "latticekit/arpa.h"
#include "latticekit/errors.h"
#include "latticekit/model.h"
#include "latticekit/search.h"

#include "check.h"

namespace latticekit {
namespace {

// Token ids: vocab[t] is the spelling of token t.
enum Token : int32_t { kUnk = 0, kBos = 1, kEos = 2, kA = 3, kB = 4, kC = 5 };
const std::vector<std::string> kVocab = {"<unk>", "<s>", "</s>", "a", "b", "c"};

// The golden model. States with arcs: root, <s>, a, b, "<s> a", "a b".
const char kTinyArpa[] =
    "\\data\\\n"
    "ngram 1=6\n"
    "ngram 2=5\n"
    "ngram 3=2\n"
    "\n"
    "\\1-grams:\n"
    "-1.0\t<unk>\n"
    "-99\t<s>\t-0.5\n"
    "-0.7\t</s>\n"
    "-0.6\ta\t-0.3\n"
    "-0.8\tb\t-0.2\n"
    "-0.9\tc\n"
    "\n"
    "\\2-grams:\n"
    "-0.2\t<s> a\t-0.1\n"
    "-0.3\ta </s>\n"
    "-0.4\ta b\t-0.15\n"
    "-0.25\tb a\n"
    "-0.5\tb c\n"
    "\n"
    "\\3-grams:\n"
    "-0.05\t<s> a b\n"
    "-0.1\ta b c\n"
    "\n"
    "\\end\\\n";

std::unique_ptr<Model> BuildModel(const std::string &text) {
  return Model::Build(ParseArpa(text.data(), text.size(), "tiny.arpa"), kVocab, true, "tiny.arpa");
}

std::string ReadFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string &path, const char *data, size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(data, static_cast<std::streamsize>(size));
}

double ScoreOf(const Model &model, StateId start, std::vector<int32_t> tokens) {
  return model.Score(start, tokens.data(), tokens.size(), nullptr, nullptr);
}

StateId StateAfter(const Model &model, StateId start, std::vector<int32_t> tokens) {
  StateId end;
  model.Score(start, tokens.data(), tokens.size(), nullptr, &end);
  return end;
}

void TestStructure(const Model &model) {
  CHECK(model.order() == 3);
  CHECK(model.count(1) == 6);
  CHECK(model.count(2) == 5);
  CHECK(model.count(3) == 2);
  CHECK(model.num_words() == 6);
  CHECK(model.num_tokens() == 6);
  CHECK(model.has_vocab());
  CHECK(model.WordText(model.TokenToWord(kB)) == "b");
  CHECK(model.TokenToWord(99) == kUnkWord);
  CHECK(model.TokenToWord(-1) == kUnkWord);
  CHECK_NEAR(model.MaxAbsLog10Prob(), 99.0, 1e-6);
  CHECK_NEAR(model.MaxAbsLog10Backoff(), 0.5, 1e-6);
}

void TestScoring(const Model &model) {
  const StateId root = model.StartState(false), bos = model.StartState(true);
  // Explicit n-grams.
  CHECK_NEAR(ScoreOf(model, root, {kA}), -0.6, 1e-6);
  CHECK_NEAR(ScoreOf(model, root, {kA, kB}), -0.6 - 0.4, 1e-6);
  CHECK_NEAR(ScoreOf(model, bos, {kA, kB, kC}), -0.2 - 0.05 - 0.1, 1e-6);
  // Back-off once: "b b" is missing, bo(b) + p(b).
  CHECK_NEAR(ScoreOf(model, root, {kB, kB}), -0.8 + (-0.2 - 0.8), 1e-6);
  // Back-off twice: "<s> a c" and "a c" are missing, bo(<s> a) + bo(a) + p(c).
  CHECK_NEAR(ScoreOf(model, bos, {kA, kC}), -0.2 + (-0.1 - 0.3 - 0.9), 1e-6);
  // The highest order's arc leads to the longest suffix that is a state: after "<s> a b",
  // "a b", which has "a b c".
  CHECK_NEAR(ScoreOf(model, bos, {kA, kB, kC}) - ScoreOf(model, bos, {kA, kB}), -0.1, 1e-6);
  // A state without arcs or weight is replaced by its back-off state: "b c" -> "c" -> root.
  CHECK(StateAfter(model, root, {kB, kC}) == kRootState);
  // Unknown tokens score as <unk>; c has no back-off weight, so from c: p(<unk>).
  CHECK_NEAR(ScoreOf(model, root, {kC, 99}), -0.9 - 1.0, 1e-6);
  // Per-token values and the context state (only the last order - 1 tokens matter).
  const int32_t tokens[] = {kA, kB, kC};
  double per_token[3];
  const double total = model.Score(bos, tokens, 3, per_token, nullptr);
  CHECK_NEAR(per_token[0], -0.2, 1e-6);
  CHECK_NEAR(per_token[1], -0.05, 1e-6);
  CHECK_NEAR(per_token[2], -0.1, 1e-6);
  CHECK(total == per_token[0] + per_token[1] + per_token[2]);
  const int32_t context[] = {kC, kC, kA, kB};
  CHECK(model.ContextState(context, 4, true) == StateAfter(model, root, {kA, kB}));
}

void TestArcLookup(const Model &model) {
  // Root arcs are the words themselves.
  for (WordId w = 0; w < model.num_words(); ++w) CHECK(model.FindArc(kRootState, w) == w);
  CHECK(model.FindArc(kRootState, static_cast<WordId>(model.num_words())) == kNoArc);
  const StateId a = StateAfter(model, kRootState, {kA});
  const WordId b = model.TokenToWord(kB), c = model.TokenToWord(kC);
  const uint32_t ab = model.FindArc(a, b);
  CHECK(ab != kNoArc);
  CHECK(ab >= model.ArcBegin(a) && ab < model.ArcEnd(a));
  CHECK(model.ArcWord(ab) == b);
  CHECK(model.ArcLog10Prob(ab) == -0.4f);
  CHECK(model.FindArc(a, c) == kNoArc);
  CHECK(model.FindArc(a, model.TokenToWord(kEos)) != kNoArc);
  CHECK(model.BackoffWeight(a) == -0.3f);
  CHECK(model.BackoffState(a) == kRootState);
  // "a b" -> its arc "a b c" is of the highest order.
  const StateId state_ab = StateAfter(model, kRootState, {kA, kB});
  CHECK(model.HistoryLength(state_ab) == 2);
  const uint32_t abc = model.FindArc(state_ab, c);
  CHECK(abc != kNoArc && model.IsTopArc(abc));
  CHECK(model.ArcLog10Prob(abc) == -0.1f);
  CHECK(model.FindArc(state_ab, b) == kNoArc);
}

void TestBinaryRoundTrip(const Model &model, const std::string &dir) {
  const std::string path = dir + "/tiny.lkm";
  WriteFile(path, model.image(), model.size_bytes());
  std::unique_ptr<Model> loaded = Model::Load(path);
  CHECK(loaded->size_bytes() == model.size_bytes());
  CHECK(std::equal(model.image(), model.image() + model.size_bytes(), loaded->image()));
  CHECK(loaded->serial() != model.serial());
  const StateId bos = loaded->StartState(true);
  CHECK(ScoreOf(*loaded, bos, {kA, kC, kB, kEos}) ==
        ScoreOf(model, model.StartState(true), {kA, kC, kB, kEos}));
  for (int n = 1; n <= 3; ++n) {
    const size_t count = model.count(n);
    std::vector<int32_t> ids(count * n), loaded_ids(count * n);
    std::vector<float> prob(count), backoff(count), loaded_prob(count), loaded_backoff(count);
    model.NGrams(n, ids.data(), prob.data(), backoff.data());
    loaded->NGrams(n, loaded_ids.data(), loaded_prob.data(), loaded_backoff.data());
    CHECK(ids == loaded_ids && prob == loaded_prob && backoff == loaded_backoff);
  }
  // An ARPA file reads as its text does.
  const std::string arpa_path = dir + "/tiny.arpa";
  WriteFile(arpa_path, kTinyArpa, sizeof kTinyArpa - 1);
  const std::string text = ReadFile(arpa_path);
  std::unique_ptr<Model> from_file =
      Model::Build(ParseArpa(text.data(), text.size(), arpa_path), kVocab, true, arpa_path);
  CHECK(from_file->size_bytes() == model.size_bytes());
  CHECK(std::equal(model.image(), model.image() + model.size_bytes(), from_file->image()));
}

// Buffers for p paths of h tokens, and the PathsOut that points into them.
struct PathBuffers {
  PathBuffers(int p, int h) : tokens(static_cast<size_t>(p) * h, -1), score(p), draft(p), lm(p) {
    out.tokens = tokens.data();
    out.score = score.data();
    out.draft_score = draft.data();
    out.lm_score = lm.data();
  }
  PathBuffers(const PathBuffers &) = delete;  // out points into this object's vectors
  PathBuffers &operator=(const PathBuffers &) = delete;

  std::vector<int32_t> tokens;
  std::vector<double> score, draft, lm;
  PathsOut out;
};

struct Path {
  std::vector<int32_t> tokens;
  std::vector<int> arcs;
  double score, draft, lm;
};

// Every path of the lattice, best first (ties by tokens, then arcs, as the search breaks them).
std::vector<Path> BruteForce(const Model &model, const LatticeView &lattice, StateId start,
                             double alpha) {
  std::vector<Path> paths;
  std::vector<int> arcs(lattice.h, 0);
  while (true) {
    Path path;
    path.arcs = arcs;
    path.draft = 0;
    for (int d = 0; d < lattice.h; ++d) {
      path.tokens.push_back(lattice.tokens[d * lattice.k + arcs[d]]);
      path.draft += lattice.scores[d * lattice.k + arcs[d]];
    }
    path.lm = model.Score(start, path.tokens.data(), path.tokens.size(), nullptr, nullptr) *
              std::log(10.0);
    path.score = path.draft + alpha * path.lm;
    paths.push_back(path);
    int d = lattice.h - 1;
    while (d >= 0 && ++arcs[d] == (lattice.widths ? lattice.widths[d] : lattice.k)) arcs[d--] = 0;
    if (d < 0) break;
  }
  std::sort(paths.begin(), paths.end(), [](const Path &x, const Path &y) {
    if (x.score != y.score) return x.score > y.score;
    if (x.tokens != y.tokens) return x.tokens < y.tokens;
    return x.arcs < y.arcs;
  });
  return paths;
}

void TestSearch(const Model &model) {
  // h = 3 positions of k = 4 arcs, the last position 3 wide; a repeated token (kA twice in
  // position 0) and <unk> included.
  const int h = 3, k = 4;
  const int32_t tokens[h * k] = {kA, kB, kA, kC,  //
                                 kB, kC, kEos, 99,  //
                                 kC, kA, kB, kB};
  const float scores[h * k] = {-0.5f, -1.25f, -0.75f, -2.0f,  //
                               -0.1f, -0.3f, -1.5f, -0.9f,    //
                               -0.2f, -0.4f, -0.6f, 0.0f};
  const int32_t widths[h] = {4, 4, 3};
  LatticeView lattice;
  lattice.tokens = tokens;
  lattice.scores = scores;
  lattice.widths = widths;
  lattice.h = h;
  lattice.k = k;
  const int32_t context[] = {kB, kA};
  for (int with_context = 0; with_context < 2; ++with_context) {
    for (double alpha : {0.0, 0.5, 1.0, 3.0}) {
      const StateId start =
          with_context ? model.ContextState(context, 2, true) : model.StartState(true);
      const std::vector<Path> expected = BruteForce(model, lattice, start, alpha);
      CHECK(expected.size() == 4 * 4 * 3);
      for (int p : {1, 2, 5, 48, 60}) {
        PathBuffers got(p, h);
        const int n = PBestOne(model, lattice, with_context ? context : nullptr,
                               with_context ? 2 : 0, true, p, alpha, got.out);
        CHECK(n == std::min<int>(p, static_cast<int>(expected.size())));
        for (int r = 0; r < n; ++r) {
          const Path &want = expected[r];
          CHECK(std::equal(want.tokens.begin(), want.tokens.end(), &got.tokens[r * h]));
          CHECK_NEAR(got.score[r], want.score, 1e-9);
          CHECK_NEAR(got.draft[r], want.draft, 1e-9);
          CHECK_NEAR(got.lm[r], want.lm, 1e-9);
        }
      }
    }
  }
  // The batch gives each lattice what PBestOne gives it.
  const int batch = 2, p = 3;
  std::vector<int32_t> batch_tokens(tokens, tokens + h * k), batch_widths(widths, widths + h);
  std::vector<float> batch_scores(scores, scores + h * k);
  batch_tokens.insert(batch_tokens.end(), tokens, tokens + h * k);
  batch_widths.insert(batch_widths.end(), {2, 1, 3});
  batch_scores.insert(batch_scores.end(), scores, scores + h * k);
  LatticeBatchView lattices;
  lattices.tokens = batch_tokens.data();
  lattices.scores = batch_scores.data();
  lattices.widths = batch_widths.data();
  lattices.batch = batch;
  lattices.h = h;
  lattices.k = k;
  const int64_t context_offsets[] = {0, 2, 2};
  std::vector<int32_t> out_tokens(batch * p * h, -1), count(batch);
  std::vector<double> score(batch * p), draft(batch * p), lm(batch * p);
  BatchPathsOut out;
  out.tokens = out_tokens.data();
  out.score = score.data();
  out.draft_score = draft.data();
  out.lm_score = lm.data();
  out.count = count.data();
  PBestBatch(model, lattices, context, context_offsets, true, p, 1.0, 2, out);
  for (int b = 0; b < batch; ++b) {
    LatticeView one = lattice;
    one.widths = batch_widths.data() + b * h;
    const StateId start = b == 0 ? model.ContextState(context, 2, true) : model.StartState(true);
    const std::vector<Path> expected = BruteForce(model, one, start, 1.0);
    CHECK(count[b] == std::min<int>(p, static_cast<int>(expected.size())));
    for (int r = 0; r < count[b]; ++r) {
      CHECK(std::equal(expected[r].tokens.begin(), expected[r].tokens.end(),
                       &out_tokens[(b * p + r) * h]));
      CHECK_NEAR(score[b * p + r], expected[r].score, 1e-9);
    }
  }
}

// CountNotAbove against the plain loop, for every n up to 40 and random keys; the words
// past n (the padding the 16-bit count may read) hold random values that must not count.
void TestCountNotAbove() {
  std::mt19937 rng(7);
  for (uint32_t n = 0; n <= 40; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint16_t> f16(n + 8);
      std::vector<uint32_t> f32(n);
      // Small ranges make equal words and keys common; 16-bit extremes test the saturation.
      const uint32_t range = trial % 2 ? 65536 : 16;
      for (uint32_t i = 0; i < n + 8; ++i) f16[i] = static_cast<uint16_t>(rng() % range);
      for (uint32_t i = 0; i < n; ++i) f32[i] = trial % 3 ? f16[i] : rng();
      for (WordId key : {WordId(0), WordId(65535), WordId(rng() % range), WordId(f16[0])}) {
        uint32_t want16 = 0, want32 = 0;
        for (uint32_t i = 0; i < n; ++i) {
          want16 += f16[i] <= key;
          want32 += f32[i] <= key;
        }
        CHECK(CountNotAbove(f16.data(), n, key) == want16);
        CHECK(CountNotAbove(f32.data(), n, key) == want32);
      }
    }
  }
}

// A bigram model of num_ints words spelled 3, 4, ... (token ids) whose states have arc lists
// of every length ArcSetLookup treats differently: <s> precedes every third word, 3 every
// fifth, 4 every 13th, 5 every 500th, 6 only word 7.
std::string LongListArpa(int num_ints) {
  std::ostringstream unigrams, bigrams;
  int n_bigrams = 0;
  const int steps[] = {3, 5, 13, 500};
  const char *histories[] = {"<s>", "3", "4", "5"};
  for (int h = 0; h < 4; ++h) {
    for (int i = 3; i < 3 + num_ints; i += steps[h], ++n_bigrams)
      bigrams << "-0.5\t" << histories[h] << ' ' << i << '\n';
  }
  bigrams << "-0.5\t6 7\n";
  ++n_bigrams;
  unigrams << "-1.5\t<unk>\n-99\t<s>\t-0.5\n-1.5\t</s>\n";
  for (int i = 3; i < 3 + num_ints; ++i) unigrams << "-2.0\t" << i << "\t-0.25\n";
  std::ostringstream arpa;
  arpa << "\\data\\\nngram 1=" << num_ints + 3 << "\nngram 2=" << n_bigrams << "\n\n\\1-grams:\n"
       << unigrams.str() << "\n\\2-grams:\n" << bigrams.str() << "\n\\end\\\n";
  return arpa.str();
}

// ArcSetLookup<Word> against a scan of each state's arcs, for random word sets: short lists
// scanned through the bit set, long ones through the fence blocks (counted, narrowed by the
// counted upper fence, or binary-searched in it).
template <typename Word>
void CheckArcSetLookup(const Model &model, int num_sets) {
  CHECK((model.WideWords() == std::is_same<Word, uint32_t>::value));
  std::vector<StateId> states = {kRootState, model.StartState(true)};
  for (int32_t t : {3, 4, 5, 6, 7}) states.push_back(StateAfter(model, kRootState, {t}));
  const uint32_t num_words = static_cast<uint32_t>(model.num_words());
  std::mt19937 rng(11);
  ArcSetLookup<Word> lookup(model);
  for (int set = 0; set < num_sets; ++set) {
    const uint32_t sizes[] = {1, 2, 3, 8, 40, 300};
    const uint32_t size = std::min(num_words, sizes[set % 6]);
    std::set<WordId> chosen;
    if (set % 7 == 0) chosen.insert(num_words - 1);  // the last word, and the first
    if (set % 7 == 1) chosen.insert(0);
    while (chosen.size() < size) chosen.insert(rng() % num_words);
    const std::vector<WordId> words(chosen.begin(), chosen.end());
    lookup.SetWords(words);
    for (StateId s : states) {
      std::vector<std::pair<uint32_t, WordId>> want, got;
      for (uint32_t a = model.ArcBegin(s); a < model.ArcEnd(s); ++a) {
        if (chosen.count(model.ArcWord(a))) want.emplace_back(a, model.ArcWord(a));
      }
      lookup.ForEachArc(model.ArcBegin(s), model.ArcEnd(s),
                        [&](uint32_t a, WordId w) { got.emplace_back(a, w); });
      CHECK(got == want);
    }
  }
}

void TestArcSetLookup() {
  // 20,000 words: uint16 arc words; the root's 20,003 arcs reach the searched upper fence,
  // <s>'s 6,667 and 3's 4,000 the counted one, 4's 1,539 the counted fence alone.
  const std::string narrow_text = LongListArpa(20000);
  const std::unique_ptr<Model> narrow =
      Model::Build(ParseArpa(narrow_text.data(), narrow_text.size(), "narrow.arpa"), {}, false,
                   "narrow.arpa");
  const auto arcs_after = [&](std::vector<int32_t> tokens) {
    const StateId s = tokens.empty() ? kRootState : StateAfter(*narrow, kRootState, tokens);
    return narrow->ArcEnd(s) - narrow->ArcBegin(s);
  };
  CHECK(arcs_after({}) == 20003);
  CHECK(narrow->ArcEnd(narrow->StartState(true)) - narrow->ArcBegin(narrow->StartState(true)) ==
        6667);
  CHECK(arcs_after({3}) == 4000 && arcs_after({4}) == 1539 && arcs_after({5}) == 40);
  CheckArcSetLookup<uint16_t>(*narrow, 120);
  // 70,000 words: uint32 arc words, the same paths.
  const std::string wide_text = LongListArpa(70000);
  const std::unique_ptr<Model> wide =
      Model::Build(ParseArpa(wide_text.data(), wide_text.size(), "wide.arpa"), {}, false,
                   "wide.arpa");
  CheckArcSetLookup<uint32_t>(*wide, 30);
}

// Exact ties: draft scores that are multiples of 0.125 sum exactly, and with alpha = 0 many
// paths have equal scores; PBestOne must order them as the enumeration does (by token
// sequence, then arc sequence).
void TestSearchTies(const Model &model) {
  std::mt19937 rng(5);
  const int h = 4, k = 4;
  for (int trial = 0; trial < 40; ++trial) {
    int32_t tokens[h * k], widths[h];
    float scores[h * k];
    for (int i = 0; i < h * k; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % 6);  // repeats within a position too
      scores[i] = -0.125f * static_cast<float>(rng() % 4);
    }
    int total = 1;
    for (int d = 0; d < h; ++d) total *= widths[d] = 1 + static_cast<int>(rng() % k);
    LatticeView lattice;
    lattice.tokens = tokens;
    lattice.scores = scores;
    lattice.widths = widths;
    lattice.h = h;
    lattice.k = k;
    const std::vector<Path> expected = BruteForce(model, lattice, model.StartState(true), 0.0);
    CHECK(static_cast<int>(expected.size()) == total);
    const int p = 1 + trial % total;
    PathBuffers got(p, h);
    const int n = PBestOne(model, lattice, nullptr, 0, true, p, 0.0, got.out);
    CHECK(n == p);
    for (int r = 0; r < n; ++r) {
      CHECK(std::equal(expected[r].tokens.begin(), expected[r].tokens.end(), &got.tokens[r * h]));
      CHECK(got.score[r] == expected[r].score);
    }
  }
}

void TestErrors(const Model &model, const std::string &dir) {
  // A malformed line: the error names the file and the line.
  std::string bad = kTinyArpa;
  bad.replace(bad.find("-0.25\tb a"), 5, "x.25");  // line 18
  CHECK_THROWS(ArpaError, ParseArpa(bad.data(), bad.size(), "bad.arpa"), [](const ArpaError &e) {
    CHECK(e.line() == 18);
    CHECK(e.path() == "bad.arpa");
    CHECK(std::string(e.what()).find("bad.arpa:18: ") == 0);
  });
  // A count that disagrees with the section: its header line.
  std::string short_section = kTinyArpa;
  short_section.replace(short_section.find("ngram 3=2"), 9, "ngram 3=3");
  CHECK_THROWS(ArpaError, ParseArpa(short_section.data(), short_section.size(), "short.arpa"),
               [](const ArpaError &e) { CHECK(e.line() > 0); });
  // Ends early: line 0, the file as a whole.
  const std::string truncated(kTinyArpa, std::string(kTinyArpa).find("\\3-grams:"));
  CHECK_THROWS(ArpaError, ParseArpa(truncated.data(), truncated.size(), "t.arpa"),
               [](const ArpaError &e) { CHECK(e.line() == 0); });

  // Binary files: not a model, truncated, corrupted.
  const std::string image(model.image(), model.size_bytes());
  const auto no_check = [](const std::exception &) {};
  const std::string junk_path = dir + "/junk.lkm";
  WriteFile(junk_path, "hello, world", 12);
  CHECK_THROWS(ModelFileError, Model::Load(junk_path), [&](const ModelFileError &e) {
    CHECK(std::string(e.what()).find("bad magic") != std::string::npos);
  });
  const std::string cut_path = dir + "/cut.lkm";
  WriteFile(cut_path, image.data(), image.size() - 64);
  CHECK_THROWS(ModelFileError, Model::Load(cut_path), no_check);
  std::string flipped = image;
  flipped[flipped.size() / 2] ^= 1;
  const std::string flipped_path = dir + "/flipped.lkm";
  WriteFile(flipped_path, flipped.data(), flipped.size());
  CHECK_THROWS(ModelFileError, Model::Load(flipped_path), [](const ModelFileError &e) {
    CHECK(std::string(e.what()).find("checksum") != std::string::npos);
  });
  CHECK_THROWS(FileSystemError, Model::Load(dir + "/missing.lkm"),
               [](const FileSystemError &e) { CHECK(e.code() != 0); });

  // Search arguments.
  const int32_t tokens[2] = {kA, kB};
  const float scores[2] = {0.0f, -1.0f};
  LatticeView lattice;
  lattice.tokens = tokens;
  lattice.scores = scores;
  lattice.h = 1;
  lattice.k = 2;
  int32_t out_tokens[2];
  double score[2], draft[2], lm[2];
  PathsOut out;
  out.tokens = out_tokens;
  out.score = score;
  out.draft_score = draft;
  out.lm_score = lm;
  CHECK_THROWS(InvalidArgument, PBestOne(model, lattice, nullptr, 0, true, 0, 1.0, out), no_check);
  CHECK_THROWS(InvalidArgument, PBestOne(model, lattice, nullptr, 0, true, 1, -1.0, out), no_check);
  const int32_t too_wide[1] = {3};
  lattice.widths = too_wide;
  CHECK_THROWS(InvalidArgument, PBestOne(model, lattice, nullptr, 0, true, 1, 1.0, out), no_check);
  lattice.widths = nullptr;
  const float nan_scores[2] = {0.0f, std::nanf("")};
  lattice.scores = nan_scores;
  CHECK_THROWS(InvalidArgument, PBestOne(model, lattice, nullptr, 0, true, 2, 1.0, out), no_check);

  // What the binding reads of each.
  try {
    throw ArpaError("x.arpa", 3, "bad");
  } catch (...) {
    const ErrorInfo info = CurrentError();
    CHECK(info.kind == ErrorInfo::kArpa && info.line == 3 && info.path == "x.arpa");
  }
  try {
    throw InvalidArgument("bad");
  } catch (...) {
    CHECK(CurrentError().kind == ErrorInfo::kInvalidArgument);
  }
  try {
    throw std::logic_error("bug");
  } catch (...) {
    CHECK(CurrentError().kind == ErrorInfo::kOther);
  }
}

}  // namespace
}  // namespace latticekit

int main(int argc, char **argv) {
  using namespace latticekit;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    std::unique_ptr<Model> model = BuildModel(kTinyArpa);
    TestStructure(*model);
    TestScoring(*model);
    TestArcLookup(*model);
    TestBinaryRoundTrip(*model, dir);
    TestSearch(*model);
    TestErrors(*model, dir);
    TestSearchTies(*model);
    TestCountNotAbove();
    TestArcSetLookup();
    testing::TestOpenMap();
    testing::TestDrafting();
  } catch (const std::exception &e) {
    std::printf("unexpected exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d checks, %d failed\n", testing::checks, testing::failures);
  return testing::failures == 0 ? 0 : 1;
}
