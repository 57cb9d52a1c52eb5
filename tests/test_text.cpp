// Tokenizer, UTF-8 streaming and sampling tests on a synthetic byte-level BPE vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "engine/gguf_vocabulary.h"
#include "gguf/gguf.h"
#include "synth/synth.h"
#include "text/sampler.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace bmoe {
namespace {

Tokenizer* tokenizer_of_preset(const std::string& preset) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bmoe-text-" + std::to_string(::getpid()) + ".gguf")).string();
  SynthSpec spec = synth_preset(preset);
  spec.n_layer = 1;
  write_synth_model(spec, path);
  auto model = GgufModel::open(path);
  auto* t = new Tokenizer(read_vocabulary(*model));
  std::filesystem::remove(path);
  return t;
}

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer* tokenizer = tokenizer_of_preset("tiny-qwen3moe");
  return *tokenizer;
}

// SPM-style BPE ("gemma4" model).
const Tokenizer& gemma_tokenizer() {
  static const Tokenizer* tokenizer = tokenizer_of_preset("tiny-gemma4");
  return *tokenizer;
}

TEST(Utf8, StreamHoldsIncompleteSequences) {
  Utf8Stream s;
  const std::string snowman = "\xE2\x98\x83";  // U+2603
  EXPECT_EQ(s.push(snowman.substr(0, 1)), "");
  EXPECT_EQ(s.push(snowman.substr(1, 1)), "");
  EXPECT_EQ(s.push(snowman.substr(2, 1) + "a"), snowman + "a");
  EXPECT_EQ(s.push("\xF0\x9F"), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an incomplete tail becomes U+FFFD
}

TEST(Utf8, InvalidBytesBecomeReplacementCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(s.push("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(Utf8, CodepointsRoundTrip) {
  const std::string text = "aé中🚀";
  std::string back;
  for (uint32_t cp : utf8_codepoints(text)) append_utf8(back, cp);
  EXPECT_EQ(back, text);
  EXPECT_EQ(utf8_codepoints(text).size(), 4u);
}

TEST(Tokenizer, DecodeInvertsEncodeOnArbitraryText) {
  const Tokenizer& t = tiny_tokenizer();
  const std::vector<std::string> texts = {"hello world", "  spaces   everywhere  ", "中文 and emoji 🚀🔥",
                                          "tabs\tnew\nlines\r\n", "digits 1234567890", "x"};
  for (const auto& text : texts) EXPECT_EQ(t.decode(t.encode(text, false, false)), text) << text;
  Rng rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng.below(30));
    for (int i = 0; i < n; ++i) append_utf8(s, static_cast<uint32_t>(rng.below(2) ? 32 + rng.below(95) : 0xA0 + rng.below(0x3000)));
    EXPECT_EQ(t.decode(t.encode(s, false, false)), s);
  }
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacters) {
  // Found by fuzz_tokenizer: malformed bytes reached PCRE2 in unchecked UTF mode and crashed.
  const Tokenizer& t = tiny_tokenizer();
  const std::string bad = std::string(" \n\xFF\xFF\xFF\n\t  x ") + "caf\xC3" + "\xE4\xBD" + "ok";
  EXPECT_FALSE(utf8_valid(bad));
  EXPECT_TRUE(utf8_valid("caf\xC3\xA9 \xF0\x9F\x9A\x80"));
  const std::vector<int32_t> ids = t.encode(bad, false, false);
  EXPECT_EQ(t.decode(ids), utf8_sanitize(bad));
  EXPECT_EQ(ids, t.encode(utf8_sanitize(bad), false, false));
}

TEST(Tokenizer, MergesCommonWords) {
  const Tokenizer& t = tiny_tokenizer();
  const auto ids = t.encode(" the", false, false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(t.token_bytes(ids[0]), " the");
  EXPECT_GT(t.encode("xqzv", false, false).size(), 1u);  // no merges: byte tokens
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  const Tokenizer& t = tiny_tokenizer();
  const int32_t im_start = t.find_token("<|im_start|>");
  ASSERT_GE(im_start, 0);
  const auto parsed = t.encode("a<|im_start|>b", true, false);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), im_start), parsed.end());
  const auto plain = t.encode("a<|im_start|>b", false, false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), im_start), plain.end());
  EXPECT_EQ(t.decode(plain), "a<|im_start|>b");
  // User-defined tokens (<think>) are recognised even without parse_special.
  const int32_t think = t.find_token("<think>");
  ASSERT_GE(think, 0);
  const auto with_think = t.encode("x<think>y", false, false);
  EXPECT_NE(std::find(with_think.begin(), with_think.end(), think), with_think.end());
}

TEST(Tokenizer, ControlTokensHiddenUnlessRequested) {
  const Tokenizer& t = tiny_tokenizer();
  const int32_t im_end = t.find_token("<|im_end|>");
  EXPECT_EQ(t.token_bytes(im_end), "");
  EXPECT_EQ(t.token_bytes(im_end, true), "<|im_end|>");
  EXPECT_TRUE(t.is_end_of_generation(im_end));
  EXPECT_FALSE(t.is_end_of_generation(t.encode("a", false, false)[0]));
}

TEST(SpmTokenizer, SpacesBecomeU2581AndWordsMerge) {
  const Tokenizer& t = gemma_tokenizer();
  EXPECT_TRUE(t.vocab().add_bos);  // llama.cpp forces BOS for Gemma 4
  const auto ids = t.encode(" the", false, false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(t.vocab().tokens[static_cast<size_t>(ids[0])], "\xE2\x96\x81the");
  EXPECT_EQ(t.token_bytes(ids[0]), " the");
}

TEST(SpmTokenizer, UnknownCharactersFallBackToByteTokens) {
  const Tokenizer& t = gemma_tokenizer();
  const auto ids = t.encode("\xE4\xBD\xA0", false, false);  // one CJK character, not in the vocabulary
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.vocab().tokens[static_cast<size_t>(ids[0])], "<0xE4>");
  EXPECT_EQ(t.decode(ids), "\xE4\xBD\xA0");
}

TEST(SpmTokenizer, DecodeInvertsEncode) {
  const Tokenizer& t = gemma_tokenizer();
  Rng rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng.below(40));
    for (int i = 0; i < n; ++i) {
      const uint64_t kind = rng.below(4);
      append_utf8(s, static_cast<uint32_t>(kind == 0 ? '\n' : kind == 1 ? ' ' : kind == 2 ? 32 + rng.below(95) : 0xA0 + rng.below(0x3000)));
    }
    EXPECT_EQ(t.decode(t.encode(s, false, false)), s);
  }
}

TEST(SpmTokenizer, LongLinesTokenizeQuickly) {
  // The whole line is one BPE word; the merge queue keeps this near-linear.
  std::string line = "the";
  for (int i = 1; i < 20000; ++i) line += " the";
  const auto ids = gemma_tokenizer().encode(line, false, false);
  EXPECT_EQ(ids.size(), 20000u);
}

TEST(Tokenizer, UnsupportedModelsAreRejected) {
  Vocabulary v;
  v.model = "bert";
  v.tokens = {"a"};
  v.types = {TokenType::Normal};
  EXPECT_THROW(Tokenizer{v}, Error);
  v.model = "gpt2";
  v.pre = "no-such-pre";
  EXPECT_THROW(Tokenizer{v}, Error);
}

// GLM's pre-tokenizer is llama3's split without llama3's whole-word lookups or implied BOS
// (llama.cpp's glm4 / chatglm-bpe); its end-of-message token (<|observation|>) ends generation.
TEST(Tokenizer, Glm4PreTokenizerAndEndOfMessage) {
  for (const char* pre : {"glm4", "chatglm-bpe", "llama3"}) {
    Vocabulary v;
    v.pre = pre;
    settle_vocabulary(v, std::nullopt);
    EXPECT_EQ(v.add_bos, std::string(pre) == "llama3") << pre;
  }
  Vocabulary v;
  v.pre = "glm4";
  v.tokens = {"a", "b", "<|user|>", "<|observation|>"};
  v.types = {TokenType::Normal, TokenType::Normal, TokenType::Control, TokenType::Control};
  v.eos = 1;
  v.eot = 2;
  const Tokenizer without_eom(v);
  EXPECT_FALSE(without_eom.is_end_of_generation(3));
  v.eom = 3;
  const Tokenizer glm(v);
  EXPECT_TRUE(glm.is_end_of_generation(3));
  EXPECT_TRUE(glm.is_end_of_generation(2));
  EXPECT_FALSE(glm.is_end_of_generation(0));
}

// Ling's pre-tokenizer (llama.cpp's bailingmoe, bailingmoe2 and llada-moe) splits text as Qwen2's
// does (its single-newline rule ends a whitespace run at the same place), so on one vocabulary
// both give the same ids; its files add no BOS.
TEST(Tokenizer, LingPreTokenizerSplitsAsQwen2) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("bmoe-ling-" + std::to_string(::getpid()) + ".gguf")).string();
  SynthSpec spec = synth_preset("tiny-qwen3moe");
  spec.n_layer = 1;
  write_synth_model(spec, path);
  const Vocabulary qwen = read_vocabulary(*GgufModel::open(path));
  std::filesystem::remove(path);
  ASSERT_EQ(qwen.pre, "qwen2");
  const Tokenizer q(qwen);
  const std::string pieces[] = {" ", "\n", "\r\n", "\t", "  ", "'s", "'LL", "'Re", "the", "The", "1", "234", "中",
                                "é", "!", "?!", "-", "\u00a0", "x", "don", "'t"};
  for (const char* pre : {"bailingmoe", "bailingmoe2", "llada-moe"}) {
    Vocabulary v = qwen;
    v.pre = pre;
    settle_vocabulary(v, std::nullopt);
    EXPECT_FALSE(v.add_bos) << pre;
    const Tokenizer ling(v);
    Rng rng(11);
    for (int trial = 0; trial < 300; ++trial) {
      std::string s;
      for (int i = 0, n = 1 + static_cast<int>(rng.below(12)); i < n; ++i) s += pieces[rng.below(std::size(pieces))];
      EXPECT_EQ(ling.encode(s, false, false), q.encode(s, false, false)) << pre << ": " << s;
    }
  }
}

// A harmony vocabulary's channel markers are printed (a reply parser reads them) and <|end|>
// closes a message, not the turn, once <|return|> and <|call|> end generation (as llama.cpp).
TEST(Tokenizer, HarmonyMarkersArePrintedAndEndClosesOnlyAMessage) {
  Vocabulary v;
  v.tokens = {"a", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|start|>"};
  v.types = {TokenType::Normal, TokenType::Control, TokenType::Control, TokenType::Control,
             TokenType::Control, TokenType::Control, TokenType::Control};
  const Tokenizer harmony(v);
  for (int32_t id : {1, 2, 3, 6}) EXPECT_EQ(harmony.token_bytes(id), v.tokens[static_cast<size_t>(id)]);
  EXPECT_EQ(harmony.token_bytes(4), "");
  EXPECT_FALSE(harmony.is_end_of_generation(3));
  EXPECT_TRUE(harmony.is_end_of_generation(4));
  EXPECT_TRUE(harmony.is_end_of_generation(5));
  EXPECT_EQ(harmony.encode("<|channel|>a", false, false), (std::vector<int32_t>{1, 0}));

  v.tokens.resize(4);  // without <|return|> and <|call|>, <|end|> still ends the turn
  v.types.resize(4);
  const Tokenizer plain(v);
  EXPECT_TRUE(plain.is_end_of_generation(3));
  EXPECT_EQ(plain.token_bytes(3), "");
}

namespace {
// Allows the tokens whose id is a multiple of `step` (none when step is 0).
struct EveryNth : TokenFilter {
  int step;
  explicit EveryNth(int s) : step(s) {}
  bool allows(int32_t t) const override { return step > 0 && t % step == 0; }
  void mask(float* logits, int n) const override {
    for (int i = 0; i < n; ++i) {
      if (!allows(i)) logits[i] = -INFINITY;
    }
  }
};
}  // namespace

TEST(Sampler, FilterRestrictsGreedyAndSampledPicks) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 50);
  Sampler greedy(SamplerConfig{});
  int32_t best = -1;
  for (int i = 0; i < 50; i += 7) {
    if (best < 0 || logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
  }
  EXPECT_EQ(greedy.sample(logits.data(), 50, EveryNth(7)), best);
  EXPECT_EQ(greedy.sample(logits.data(), 50, EveryNth(1)), Sampler::argmax(logits.data(), 50));
  SamplerConfig c;
  c.temperature = 1.5f;
  c.top_k = 0;
  c.top_p = 1.0f;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    c.seed = seed;
    Sampler s(c);
    EXPECT_EQ(s.sample(logits.data(), 50, EveryNth(7)) % 7, 0);
  }
  EXPECT_THROW(greedy.sample(logits.data(), 50, EveryNth(0)), Error);
}

TEST(Sampler, GreedyPicksArgmaxLowestOnTies) {
  const float logits[] = {0.1f, 3.0f, 3.0f, -1.0f};
  Sampler s(SamplerConfig{});
  EXPECT_EQ(s.sample(logits, 4), 1);
}

// Sampler::argmax's two-pass form must answer what a left-to-right `>` scan answers, on ties,
// signed zeros, infinities, NaNs (a leading NaN included) and lengths off the lane width.
TEST(Sampler, ArgmaxMatchesALeftToRightScan) {
  const auto scan = [](const std::vector<float>& x) {
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i) best = x[i] > x[best] ? i : best;
    return best;
  };
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 2.0f};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<float> x(1 + rng() % 70);
    for (float& v : x) v = rng() % 4 == 0 ? specials[rng() % 6] : static_cast<float>(rng() % 5) - 2.0f;
    ASSERT_EQ(Sampler::argmax(x.data(), static_cast<int>(x.size())), scan(x)) << "trial " << trial;
  }
}

TEST(Sampler, SeededSamplingIsReproducibleAndRespectsTopK) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[static_cast<size_t>(i)] = static_cast<float>(i % 10);
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 3;
  c.top_p = 1.0f;
  c.seed = 7;
  Sampler a(c), b(c);
  for (int i = 0; i < 50; ++i) {
    const int32_t x = a.sample(logits.data(), 100);
    EXPECT_EQ(x, b.sample(logits.data(), 100));
    EXPECT_EQ(logits[static_cast<size_t>(x)], 9.0f);  // only the three 9s survive top-3
  }
}

TEST(Sampler, TopPKeepsTheNucleus) {
  const float logits[] = {10.0f, 0.0f, 0.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_k = 0;
  c.top_p = 0.5f;
  Sampler s(c);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits, 4), 0);
}

TEST(Sampler, NeutralPenaltiesKeepGreedyAnArgmax) {
  const float logits[] = {0.5f, 2.0f, 2.0f, -3.0f};
  SamplerConfig c;
  c.repeat_last_n = 0;  // a window but no penalty, and a penalty but no window: both neutral
  c.repeat_penalty = 1.3f;
  EXPECT_FALSE(c.penalized());
  Sampler s(c);
  s.begin({1, 1, 2});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.sample(logits, 4), 1);
    s.accept(1);
  }
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountTheAnswerOnly) {
  // Token 0 leads by 1.0; it is in the prompt, which the OpenAI penalties do not look at.
  const float logits[] = {3.0f, 2.0f, 0.0f};
  SamplerConfig c;
  c.frequency_penalty = 0.4f;
  Sampler s(c);
  s.begin({0, 0, 0});
  EXPECT_EQ(s.sample(logits, 3), 0);
  s.accept(0);  // 3.0 - 0.4 = 2.6 still leads
  EXPECT_EQ(s.sample(logits, 3), 0);
  s.accept(0);  // 3.0 - 0.8 = 2.2 still leads
  EXPECT_EQ(s.sample(logits, 3), 0);
  s.accept(0);  // 3.0 - 1.2 = 1.8 < 2.0
  EXPECT_EQ(s.sample(logits, 3), 1);
  SamplerConfig p;
  p.presence_penalty = 1.5f;  // once, however often the token occurred
  Sampler q(p);
  q.begin({});
  q.accept(1);
  EXPECT_EQ(q.sample(logits, 3), 0);
  q.accept(0);  // both penalized by 1.5: 1.5 vs 0.5
  EXPECT_EQ(q.sample(logits, 3), 0);
  q.begin({});  // a new answer forgets the counts
  q.accept(0);
  EXPECT_EQ(q.sample(logits, 3), 1);
  // The caller's logits are not modified.
  EXPECT_EQ(logits[0], 3.0f);
}

TEST(Sampler, RepeatPenaltyLooksAtTheLastNTokensPromptIncluded) {
  const float logits[] = {2.0f, 1.5f, -1.0f, -1.2f};
  SamplerConfig c;
  c.repeat_penalty = 2.0f;
  c.repeat_last_n = 2;
  Sampler s(c);
  s.begin({0, 3, 3});  // 0 fell out of the last 2; 3 is penalized (multiplied: -2.4)
  EXPECT_EQ(s.sample(logits, 4), 0);
  s.begin({3, 0});  // 0 is in the window: 2.0 / 2 = 1.0 < 1.5
  EXPECT_EQ(s.sample(logits, 4), 1);
  s.accept(2);
  s.accept(3);  // the window slides past 0
  EXPECT_EQ(s.sample(logits, 4), 0);
  // A negative logit is multiplied, so it drops: 2 (-1.0 -> -2.0) falls below 3 (-1.2).
  const float negative[] = {-1.0f, -1.2f};
  Sampler n(c);
  n.begin({0});
  EXPECT_EQ(n.sample(negative, 2), 1);
}

TEST(Sampler, MinPDropsTheUnlikelyTail) {
  // p(1)/p(0) = e^-1 = 0.37, p(2)/p(0) = e^-5: min_p 0.1 keeps 0 and 1, never 2.
  const float logits[] = {5.0f, 4.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 1.5f;
  c.top_k = 0;
  c.top_p = 1.0f;
  c.min_p = 0.1f;
  c.seed = 3;
  Sampler s(c);
  int seen[3] = {0, 0, 0};
  for (int i = 0; i < 400; ++i) ++seen[s.sample(logits, 3)];
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2], 0);
  c.min_p = 0.5f;  // 0.37 < 0.5: only the best token is left
  Sampler t(c);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(t.sample(logits, 3), 0);
  c.min_p = 0.0f;  // off: the tail is reachable (e^-5/1.5 is not that small)
  Sampler u(c);
  int tail = 0;
  for (int i = 0; i < 4000; ++i) tail += u.sample(logits, 3) == 2;
  EXPECT_GT(tail, 0);
}

TEST(Sampler, TokenLogprobIsTheLogSoftmaxWithTheTopTokens) {
  const float logits[] = {1.0f, 3.0f, 2.0f, 3.0f, -10.0f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const TokenLogprob lp = token_logprob(logits, 5, 2, 3);
  EXPECT_EQ(lp.token, 2);
  EXPECT_NEAR(lp.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // ties: lowest id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 2);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_EQ(lp.top[2].second, lp.logprob);
  EXPECT_TRUE(token_logprob(logits, 5, 0, 0).top.empty());
  EXPECT_EQ(token_logprob(logits, 5, 0, 50).top.size(), 5u);  // at most the vocabulary
}

// llama-server's post_sampling_probs: the distribution after the chain, worked by hand.
// Logits 3, 2, 1, 0, -2: top-k 4 drops -2; min-p 0.1 (before the temperature) drops 0, whose
// e^-3 = 0.05 of the best is under 0.1; at temperature 0.5 the three left weigh 1, e^-2, e^-4
// (0.867, 0.117, 0.016): top-p 0.95 needs the first two (0.984). What is left is 1 : e^-2.
TEST(Sampler, LastDistributionIsTheChainsWorkedByHand) {
  const float logits[] = {3.0f, 2.0f, 1.0f, 0.0f, -2.0f};
  SamplerConfig c;
  c.temperature = 0.5f;
  c.top_k = 4;
  c.min_p = 0.1f;
  c.top_p = 0.95f;
  const double p0 = 1.0 / (1.0 + std::exp(-2.0));
  int seen[2] = {0, 0};
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    c.seed = seed;
    Sampler s(c);
    const int32_t pick = s.sample(logits, 5);
    ASSERT_TRUE(pick == 0 || pick == 1) << pick;
    ++seen[pick];
    const TokenLogprob d = s.last_distribution(pick, 3);
    ASSERT_EQ(d.top.size(), 2u);  // three asked for, two left with a probability
    EXPECT_EQ(d.top[0].first, 0);
    EXPECT_EQ(d.top[1].first, 1);
    EXPECT_NEAR(std::exp(d.top[0].second), p0, 1e-6);
    EXPECT_NEAR(std::exp(d.top[1].second), 1.0 - p0, 1e-6);
    EXPECT_EQ(d.logprob, d.top[static_cast<size_t>(pick)].second);
  }
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 0);
  // Greedy: llama.cpp's temperature 0 leaves the best token alone, at probability 1.
  c.temperature = 0.0f;
  Sampler g(c);
  const int32_t best = g.sample(logits, 5);
  const TokenLogprob d = g.last_distribution(best, 3);
  EXPECT_EQ(best, 0);
  EXPECT_EQ(d.logprob, 0.0f);
  ASSERT_EQ(d.top.size(), 1u);
  EXPECT_EQ(d.top[0], (std::pair<int32_t, float>{0, 0.0f}));
  EXPECT_TRUE(g.last_distribution(best, 0).top.empty());
}

}  // namespace

TEST(Tokenizer, ToolCallMarkersArePrinted) {
  Vocabulary v;
  v.tokens = {"a", "[TOOL_CALLS]", "<|im_end|>", "[ARGS]"};
  v.types = {TokenType::Normal, TokenType::Control, TokenType::Control, TokenType::Control};
  const Tokenizer t(v);
  EXPECT_EQ(t.token_bytes(1), "[TOOL_CALLS]");
  EXPECT_EQ(t.token_bytes(3), "[ARGS]");
  EXPECT_EQ(t.token_bytes(2), "");
  EXPECT_EQ((*t.token_texts())[1], "[TOOL_CALLS]");
}


// ---- llama.cpp's other samplers, against distributions worked out by hand

namespace {
// A candidate list whose probabilities (at temperature 1) are `p`, best first.
CandidateList list_of(const std::vector<double>& p) {
  CandidateList c;
  for (size_t i = 0; i < p.size(); ++i) c.items.emplace_back(static_cast<float>(std::log(p[i])), static_cast<int32_t>(i));
  return c;
}
std::vector<int32_t> ids_of(const CandidateList& c) {
  std::vector<int32_t> ids;
  for (const auto& item : c.items) ids.push_back(item.second);
  return ids;
}
}  // namespace

TEST(SamplerSteps, TypicalKeepsTheTokensNearestTheEntropy) {
  // p = .5 .3 .2: entropy 1.0297 nats; surprises .693 1.204 1.609 are .337 .174 .580 away, so
  // the order is 1, 0, 2 with running mass .3, .8, 1.
  CandidateList c = list_of({0.5, 0.3, 0.2});
  keep_typical(c, 0.5f, 0);
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{0, 1}));  // .8 > .5 after two
  c = list_of({0.5, 0.3, 0.2});
  keep_typical(c, 0.25f, 0);
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1}));  // .3 > .25 at once: not the likeliest token
  c = list_of({0.5, 0.3, 0.2});
  keep_typical(c, 0.25f, 3);  // min_keep wins
  EXPECT_EQ(c.items.size(), 3u);
}

TEST(SamplerSteps, TopNSigmaKeepsLogitsWithinNDeviations) {
  // Logits 4 2 0 -2: mean 1, variance 5, sigma 2.236.
  CandidateList c;
  c.items = {{4.0f, 0}, {2.0f, 1}, {0.0f, 2}, {-2.0f, 3}};
  CandidateList one = c, half = c, off = c;
  keep_top_n_sigma(one, 1.0f);   // floor 1.76
  keep_top_n_sigma(half, 0.5f);  // floor 2.88
  keep_top_n_sigma(off, -1.0f);
  EXPECT_EQ(ids_of(one), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(ids_of(half), (std::vector<int32_t>{0}));
  EXPECT_EQ(off.items.size(), 4u);
}

TEST(SamplerSteps, XtcDropsAllButTheLeastLikelyTopChoice) {
  CandidateList c = list_of({0.4, 0.3, 0.2, 0.1});
  exclude_top_choices(c, 0.25f, 0);  // .4 and .3 reach it: .4 goes
  EXPECT_EQ(ids_of(c), (std::vector<int32_t>{1, 2, 3}));
  c = list_of({0.4, 0.3, 0.2, 0.1});
  exclude_top_choices(c, 0.35f, 0);  // only one reaches it: nothing goes
  EXPECT_EQ(c.items.size(), 4u);
  c = list_of({0.4, 0.3, 0.2, 0.1});
  exclude_top_choices(c, 0.25f, 4);  // min_keep
  EXPECT_EQ(c.items.size(), 4u);
}

TEST(SamplerSteps, DynamicTemperatureFollowsNormalisedEntropy) {
  EXPECT_FLOAT_EQ(dynamic_temperature(list_of({0.25, 0.25, 0.25, 0.25}), 1.0f, 0.5f, 1.0f), 1.5f);  // uniform: t + range
  // Two of four tokens equally likely: entropy ln 2 of ln 4 = 0.5; 0.5 + 1.0 * 0.5^2 = 0.75.
  CandidateList c;
  c.items = {{0.0f, 0}, {0.0f, 1}, {-INFINITY, 2}, {-INFINITY, 3}};
  EXPECT_NEAR(dynamic_temperature(c, 1.0f, 0.5f, 2.0f), 0.75f, 1e-6f);
  EXPECT_FLOAT_EQ(dynamic_temperature(c, 0.7f, 0.0f, 2.0f), 0.7f);  // no range: fixed
}

TEST(SamplerSteps, MirostatV2KeepsTokensBelowMuAndMovesIt) {
  // Surprises 1 2 3 3 bits; mu 2 keeps tokens 0 and 1, renormalised to 2/3 and 1/3.
  int picked[2] = {0, 0};
  Rng rng(11);
  for (int i = 0; i < 3000; ++i) {
    CandidateList c = list_of({0.5, 0.25, 0.125, 0.125});
    float mu = 2.0f;
    const int32_t t = mirostat_v2(c, 1.0f, 0.1f, mu, rng);
    ASSERT_TRUE(t == 0 || t == 1);
    ++picked[t];
    const double p = t == 0 ? 2.0 / 3.0 : 1.0 / 3.0;
    EXPECT_NEAR(mu, 2.0 - 0.1 * (-std::log2(p) - 1.0), 1e-5);
  }
  EXPECT_NEAR(picked[0] / 3000.0, 2.0 / 3.0, 0.03);
}

TEST(SamplerSteps, MirostatV1EstimatesZipfsExponent) {
  // p_i ~ 1/(i+1)^2 over 10 tokens: s = 2, so k = (2^mu / (1 - 1/10))^(1/2) = 2.108 at mu 2:
  // tokens 0 and 1, renormalised to .8 and .2.
  std::vector<double> p;
  for (int i = 0; i < 10; ++i) p.push_back(1.0 / ((i + 1.0) * (i + 1.0)));
  Rng rng(5);
  for (int i = 0; i < 200; ++i) {
    CandidateList c = list_of(p);
    float mu = 2.0f;
    const int32_t t = mirostat_v1(c, 1.0f, 0.1f, 100, 10, mu, rng);
    ASSERT_TRUE(t == 0 || t == 1);
    EXPECT_NEAR(mu, 2.0 - 0.1 * (-std::log2(t == 0 ? 0.8 : 0.2) - 1.0), 1e-4);
  }
}

TEST(SamplerSteps, DryPenalisesTheTokenThatWouldRepeatASequence) {
  // "1 2 3" ends the text and came before, followed by 4: a repeat of 3, penalty 1 * 2^(3-2).
  const std::vector<int32_t> history = {1, 2, 3, 4, 9, 1, 2, 3};
  std::vector<float> logits(10, 0.0f);
  dry_penalize(history, {9}, 1.0f, 2.0f, 2, logits.data(), 10);
  for (int t = 0; t < 10; ++t) EXPECT_FLOAT_EQ(logits[static_cast<size_t>(t)], t == 4 ? -2.0f : 0.0f) << t;
  // A breaker inside the end cuts the repeat to "3": shorter than allowed, no penalty.
  std::fill(logits.begin(), logits.end(), 0.0f);
  dry_penalize(history, {2}, 1.0f, 2.0f, 2, logits.data(), 10);
  for (float l : logits) EXPECT_FLOAT_EQ(l, 0.0f);
}

TEST(SamplerSteps, StepNamesFollowLlamaServer) {
  SamplerStep s = SamplerStep::TopK;
  std::string penalty;
  EXPECT_TRUE(sampler_step_named("typ_p", &s, &penalty));
  EXPECT_EQ(s, SamplerStep::Typical);
  EXPECT_TRUE(sampler_step_named("Top-N-Sigma", &s, &penalty));
  EXPECT_EQ(s, SamplerStep::TopNSigma);
  EXPECT_TRUE(sampler_step_named("x", &s, &penalty));
  EXPECT_EQ(s, SamplerStep::Xtc);
  EXPECT_TRUE(sampler_step_named("dry", &s, &penalty));
  EXPECT_EQ(penalty, "dry");
  EXPECT_FALSE(sampler_step_named("beam", &s, &penalty));
}

TEST(Sampler, OrderDecidesWhatRuns) {
  // Top-k 1 alone always gives the best token at any temperature; without it all three come.
  const float logits[] = {1.0f, 0.9f, 0.8f};
  SamplerConfig c;
  c.temperature = 2.0f;
  c.top_k = 1;
  c.order = {SamplerStep::TopK};
  Sampler only_k(c);
  c.order = {SamplerStep::Temperature};
  Sampler free(c);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(only_k.sample(logits, 3), 0);
    seen.insert(free.sample(logits, 3));
  }
  EXPECT_EQ(seen.size(), 3u);
}

TEST(Sampler, DryStopsAGreedyLoop) {
  // Greedy would pick 1 after "1 2 1 2"; the end "1 2" came before, followed by 1: a repeat
  // of 2 tokens, penalty 1 * 1.75^(2-1), which puts 1 below the others.
  std::vector<float> logits = {0.0f, 0.5f, 0.0f};
  SamplerConfig c;
  c.dry_multiplier = 1.0f;
  c.dry_allowed_length = 1;
  Sampler s(c);
  s.begin({1, 2, 1, 2});
  EXPECT_TRUE(c.penalized());
  EXPECT_EQ(s.sample(logits.data(), 3), 0);
}

}  // namespace bmoe
