// et_native: a .pte run by ExecuTorch's C++ runtime with no Python and no libtorch, the way a
// device application runs it. Linked against the executorch wheel's shared runtime
// (libexecutorch, the XNNPACK delegate, the optimized and quantized CPU kernels) plus
// llama_kernels.cpp. Built and driven by harness/runtimes/native.py.
//
//   et_native PTE THREADS --serve
//       prints {"load_s": ...}, then answers each stdin line {"prompt": [ids], "new_tokens": n}
//       with {"sample": {...}}: greedy, no EOS stop, prefill in one call (the protocol of
//       harness.bench.protocol, timed here around the runtime's own calls).
//   et_native PTE THREADS --once PROMPT_JSON NEW_TOKENS
//       one generation in a fresh process: load time, RSS before loading, peak RSS.
//   et_native PTE THREADS --logits PROMPT_JSON [CHUNK]
//       the prompt's logits at every position, fed in calls of CHUNK ids (default: one call), for
//       comparing with the Python runtime.
//   et_native - THREADS --bandwidth MB
//       this machine's memory read bandwidth over an MB buffer, THREADS threads each summing its
//       slice (best of 5), for the roofline where numpy is not installed (the Pi 5 tier).
//
// The program's signature is the harness's: forward(input_ids[1, s] int64, cache_position[s]
// int64) -> logits[1, s, V] float32.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <atomic>
#include <thread>
#include <iostream>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

// libexecutorch_threadpool.so exports these; the wheel ships no header for them.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t new_thread_count);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

using executorch::extension::make_tensor_ptr;
using executorch::extension::module::Module;
using executorch::runtime::EValue;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(2);
}

double status_mb(const char* key) {  // VmRSS / VmHWM from /proc/self/status, in MiB
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.compare(0, k.size(), k) == 0) return std::strtod(line.c_str() + k.size(), nullptr) / 1024.0;
  return -1.0;
}

// The integers of the JSON array after "key": (the only JSON these requests hold).
std::vector<int64_t> ints_after(const std::string& s, const std::string& key) {
  const auto at = s.find("\"" + key + "\"");
  if (at == std::string::npos) die("request without \"" + key + "\": " + s);
  const auto open = s.find('[', at), close = s.find(']', at);
  if (open == std::string::npos || close == std::string::npos || close < open)
    die("\"" + key + "\" is not a list of token ids: " + s);
  std::vector<int64_t> out;
  const char* p = s.c_str() + open + 1;
  const char* e = s.c_str() + close;
  while (p < e) {
    char* next = nullptr;
    const long long v = std::strtoll(p, &next, 10);
    if (next == p) {
      ++p;
      continue;
    }
    out.push_back(v);
    p = next;
  }
  return out;
}

int64_t int_after(const std::string& s, const std::string& key) {
  const auto at = s.find("\"" + key + "\"");
  if (at == std::string::npos) die("request without \"" + key + "\": " + s);
  const auto colon = s.find(':', at);
  return std::strtoll(s.c_str() + colon + 1, nullptr, 10);
}

std::string ids_json(const std::vector<int64_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Model {
  Module module;
  int64_t vocab = -1, max_context = -1;  // from the program's metadata methods, when it has them
  explicit Model(const std::string& pte) : module(pte, Module::LoadMode::Mmap) {
    if (module.load_method("forward") != executorch::runtime::Error::Ok)
      die("cannot load method forward of " + pte + " (see the log above: a missing kernel names itself)");
    vocab = constant("get_vocab_size");
    max_context = constant("get_max_context_len");
  }
  int64_t constant(const char* name) {
    auto names = module.method_names();
    if (!names.ok() || names->count(name) == 0) return -1;
    auto r = module.execute(name);
    return r.ok() && !r->empty() && (*r)[0].isInt() ? (*r)[0].toInt() : -1;
  }
  void check(const std::vector<int64_t>& prompt, int64_t new_tokens) const {
    if (prompt.empty() || new_tokens < 1) die("a request needs a non-empty prompt and new_tokens >= 1");
    for (auto id : prompt)
      if (id < 0 || (vocab > 0 && id >= vocab))
        die("token id " + std::to_string(id) + " is outside the model's vocabulary [0, " + std::to_string(vocab) +
            "): tokenize with the model's own tokenizer");
    if (max_context > 0 && static_cast<int64_t>(prompt.size()) + new_tokens - 1 > max_context)
      die(std::to_string(prompt.size()) + " prompt + " + std::to_string(new_tokens) + " new tokens exceed the program's " +
          std::to_string(max_context) + "-token context: shorten the prompt or ask for fewer tokens");
  }
  // logits of the last position (or all positions into `all`) after feeding ids at start..
  executorch::aten::Tensor step(const std::vector<int64_t>& ids, int64_t start) {
    const auto n = static_cast<executorch::aten::SizesType>(ids.size());
    std::vector<int64_t> pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) pos[i] = start + static_cast<int64_t>(i);
    auto input = make_tensor_ptr({1, n}, std::vector<int64_t>(ids));
    auto cache_position = make_tensor_ptr({n}, std::move(pos));
    auto result = module.execute("forward", std::vector<EValue>{EValue(*input), EValue(*cache_position)});
    if (!result.ok()) die("forward failed at position " + std::to_string(start) + " (error " +
                          std::to_string(static_cast<int>(result.error())) + ")");
    return result.get()[0].toTensor();
  }
};

int64_t argmax_last(const executorch::aten::Tensor& logits) {
  const int64_t V = logits.size(logits.dim() - 1);
  const float* row = logits.const_data_ptr<float>() + (logits.numel() - V);
  int64_t best = 0;
  for (int64_t j = 1; j < V; ++j)
    if (row[j] > row[best]) best = j;  // the first of equal maxima, as torch.argmax
  return best;
}

std::string sample_json(Model& m, const std::vector<int64_t>& prompt, int64_t new_tokens) {
  m.check(prompt, new_tokens);
  const double t0 = now();
  int64_t next = argmax_last(m.step(prompt, 0));
  const double t1 = now();
  std::vector<int64_t> ids{next};
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (int64_t k = 1; k < new_tokens; ++k, ++pos) {
    next = argmax_last(m.step({next}, pos));
    ids.push_back(next);
  }
  const double t2 = now();
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"prompt_tokens\": %zu, \"new_tokens\": %lld, \"ttft_s\": %.9f, \"decode_s\": %.9f, \"ids\": ",
                prompt.size(), static_cast<long long>(new_tokens), t1 - t0, t2 - t1);
  return std::string(buf) + ids_json(ids) + "}";
}

// Seconds of the fastest of 5 passes in which THREADS threads each sum their slice of a buffer
// (its pages faulted in first), from a common start; the bytes over that time, in GB/s.
double read_gb_s(long threads, long mb) {
  const size_t n = static_cast<size_t>(mb) * (size_t{1} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> data(n, 1);
  std::vector<uint64_t> sums(threads, 0);
  double best = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    std::atomic<long> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (long t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        uint64_t a = 0, b = 0, c = 0, d = 0;
        size_t i = lo;
        for (; i + 4 <= hi; i += 4) { a += data[i]; b += data[i + 1]; c += data[i + 2]; d += data[i + 3]; }
        for (; i < hi; ++i) a += data[i];
        sums[t] = a + b + c + d;
      });
    while (ready.load() < threads) std::this_thread::yield();
    const double t0 = now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    best = std::min(best, now() - t0);
    uint64_t total = 0;
    for (auto v : sums) total += v;
    if (total != n) die("the bandwidth loop summed " + std::to_string(total) + ", expected " + std::to_string(n));
  }
  return static_cast<double>(n * sizeof(uint64_t)) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[3]) == "--bandwidth") {
    const long threads = std::strtol(argv[2], nullptr, 10), mb = std::strtol(argv[4], nullptr, 10);
    if (threads < 1 || mb < 1) die("usage: et_native - THREADS --bandwidth MB (positive integers)");
    std::printf("{\"read_gb_s\": %.6f, \"threads\": %ld, \"buffer_mb\": %ld}\n", read_gb_s(threads, mb), threads, mb);
    return 0;
  }
  if (argc < 4) die("usage: et_native PTE THREADS --serve | --once PROMPT_JSON NEW_TOKENS | --logits PROMPT_JSON [CHUNK] | - THREADS --bandwidth MB");
  const std::string pte = argv[1], mode = argv[3];
  const long threads = std::strtol(argv[2], nullptr, 10);
  if (threads < 1) die("THREADS must be a positive integer, got " + std::string(argv[2]));
  {
    std::ifstream probe(pte, std::ios::binary);
    if (!probe) die("cannot read " + pte + ": give the path of a .pte (harness export writes one)");
  }
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr || !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads)))
    die("cannot size ExecuTorch's thread pool to " + std::to_string(threads));
  const double base = status_mb("VmRSS");
  const double t0 = now();
  Model model(pte);
  const double load_s = now() - t0;

  if (mode == "--serve") {
    std::printf("{\"load_s\": %.9f, \"threads\": %zu}\n", load_s, pool->get_thread_count());
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string s = sample_json(model, ints_after(line, "prompt"), int_after(line, "new_tokens"));
      std::printf("{\"sample\": %s}\n", s.c_str());
      std::fflush(stdout);
    }
    return 0;
  }
  if (mode == "--once" && argc == 6) {
    const std::string s = sample_json(model, ints_after(std::string("{\"prompt\": ") + argv[4] + "}", "prompt"),
                                      std::strtoll(argv[5], nullptr, 10));
    const double peak = status_mb("VmHWM");
    std::printf("{\"load_s\": %.9f, \"base_rss_mb\": %.3f, \"peak_rss_mb\": %.3f, \"model_rss_mb\": %.3f, \"sample\": %s}\n",
                load_s, base, peak, peak - base, s.c_str());
    return 0;
  }
  if (mode == "--logits" && (argc == 5 || argc == 6)) {
    // the prompt fed in calls of CHUNK ids (default: all in one), every position's logits
    const auto ids = ints_after(std::string("{\"prompt\": ") + argv[4] + "}", "prompt");
    model.check(ids, 1);
    const long chunk = argc == 6 ? std::strtol(argv[5], nullptr, 10) : static_cast<long>(ids.size());
    if (chunk < 1) die("CHUNK must be a positive integer, got " + std::string(argv[5]));
    std::string out = "[";
    char buf[32];
    int64_t vocab = 0;
    for (size_t at = 0; at < ids.size(); at += chunk) {
      const std::vector<int64_t> part(ids.begin() + at, ids.begin() + std::min(ids.size(), at + chunk));
      const auto logits = model.step(part, static_cast<int64_t>(at));
      vocab = logits.size(logits.dim() - 1);
      const float* d = logits.const_data_ptr<float>();
      for (ssize_t i = 0; i < logits.numel(); ++i) {
        std::snprintf(buf, sizeof buf, "%s%.9g", out.size() > 1 ? "," : "", d[i]);
        out += buf;
      }
    }
    std::printf("{\"shape\": [1, %zu, %lld], \"logits\": %s]}\n", ids.size(), static_cast<long long>(vocab),
                out.c_str());
    return 0;
  }
  die("unknown mode " + mode + " (use --serve, --once PROMPT_JSON NEW_TOKENS or --logits PROMPT_JSON)");
}
