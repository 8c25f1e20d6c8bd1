// data_prepare: text files -> one tandem token file. Files are read whole (inputs are
// expected to fit in memory); with a real tokenizer, pieces of them are encoded on a pool
// of threads, each piece into its own vector, and the vectors are joined in order.
#include "io/prepare.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "io/tokens.h"

namespace tandem {

namespace {

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  TD_CHECK(!std::filesystem::is_directory(path, ec), "text file '{}' is a directory", path);
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in, "cannot read text file '{}': {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TD_CHECK(!in.bad(), "cannot read text file '{}': {}", path, std::strerror(errno));
  return text;
}

bool ascii_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

PrepareReport prepare_bytes(const std::vector<std::string>& text_files, const std::string& out,
                            const PrepareOptions& options) {
  PrepareReport report;
  std::string all;
  for (const std::string& path : text_files) {
    const std::string text = read_text_file(path);
    report.files += 1;
    report.bytes += text.size();
    if (text.empty()) continue;
    if (!all.empty() && all.back() != '\n') all.push_back('\n');
    all += text;
  }
  TD_CHECK(!all.empty(), "cannot prepare data file '{}': the {} text file(s) given are all empty",
           out, text_files.size());
  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint32_t> tokens = ByteTokenizer().encode(all);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) options.progress(all.size(), all.size());
  tokens_write(out, tokens, 2);
  report.tokens = tokens.size();
  return report;
}

struct Piece {
  size_t doc;  // index into the documents
  size_t begin, end;
};

}  // namespace

std::vector<size_t> prepare_cut_points(std::string_view text, size_t chunk_bytes) {
  std::vector<size_t> cuts;
  if (chunk_bytes == 0) return cuts;
  for (size_t at = chunk_bytes; at < text.size();) {
    size_t nl = text.find('\n', at);
    while (nl != std::string_view::npos && nl + 1 < text.size() &&
           !(nl > 0 && ascii_alnum(text[nl - 1]) && !ascii_space(text[nl + 1])))
      nl = text.find('\n', nl + 1);
    if (nl == std::string_view::npos || nl + 1 >= text.size()) break;
    cuts.push_back(nl + 1);
    at = nl + 1 + chunk_bytes;
  }
  return cuts;
}

PrepareReport data_prepare(const std::vector<std::string>& text_files, const std::string& out,
                           const PrepareOptions& options) {
  TD_CHECK(!text_files.empty(), "cannot prepare data file '{}': no text files given", out);
  // Writing the output over one of the inputs would destroy the text being read.
  for (const std::string& f : text_files) {
    std::error_code ec;
    TD_CHECK(!std::filesystem::equivalent(f, out, ec),
             "cannot prepare data file '{}': it is the input text file '{}'", out, f);
  }
  if (options.tokenizer == nullptr) return prepare_bytes(text_files, out, options);
  const Tokenizer& tok = *options.tokenizer;
  TD_CHECK(tok.eos_id().has_value(),
           "cannot prepare data file '{}': the {} tokenizer has no EOS token to put between "
           "documents",
           out, tok.kind());

  PrepareReport report;
  std::vector<std::string> docs;
  for (const std::string& path : text_files) {
    std::string text = read_text_file(path);
    report.files += 1;
    report.bytes += text.size();
    if (!text.empty()) docs.push_back(std::move(text));
  }
  TD_CHECK(!docs.empty(), "cannot prepare data file '{}': the {} text file(s) given are all empty",
           out, text_files.size());

  std::vector<Piece> pieces;
  for (size_t d = 0; d < docs.size(); ++d) {
    size_t begin = 0;
    for (size_t cut : prepare_cut_points(docs[d], options.chunk_bytes)) {
      pieces.push_back({d, begin, cut});
      begin = cut;
    }
    pieces.push_back({d, begin, docs[d].size()});
  }

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, std::min<int>(options.threads > 0 ? options.threads : cores,
                                                static_cast<int>(pieces.size())));
  report.threads = threads;
  std::vector<std::vector<uint32_t>> encoded(pieces.size());
  std::atomic<size_t> next{0}, bytes_done{0};
  std::mutex mu;
  std::condition_variable cv;
  int running = threads;
  std::string failure;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&] {
      try {
        for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
          const Piece& p = pieces[i];
          const std::string_view text =
              std::string_view(docs[p.doc]).substr(p.begin, p.end - p.begin);
          tok.encode_into(text, false, encoded[i]);
          bytes_done += text.size();
        }
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (failure.empty()) failure = e.message();
        next = pieces.size();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (failure.empty()) failure = e.what();
        next = pieces.size();
      }
      std::lock_guard<std::mutex> lock(mu);
      --running;
      cv.notify_all();
    });
  }
  size_t total = 0;
  for (const auto& d : docs) total += d.size();
  {
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return running == 0; }))
      if (options.progress) {
        lock.unlock();
        options.progress(bytes_done.load(), total);
        lock.lock();
      }
  }
  for (auto& t : pool) t.join();
  TD_CHECK(failure.empty(), "cannot prepare data file '{}': {}", out, failure);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) options.progress(total, total);

  std::vector<uint32_t> tokens;
  size_t count = docs.size() - 1;
  for (const auto& e : encoded) count += e.size();
  tokens.reserve(count);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0 && pieces[i].doc != pieces[i - 1].doc) tokens.push_back(*tok.eos_id());
    tokens.insert(tokens.end(), encoded[i].begin(), encoded[i].end());
  }
  TD_CHECK(!tokens.empty(), "cannot prepare data file '{}': the text encodes to no tokens", out);
  report.token_bytes = tokens_min_width(static_cast<uint32_t>(tok.vocab_size() - 1));
  tokens_write(out, tokens, report.token_bytes);
  report.tokens = tokens.size();
  return report;
}

}  // namespace tandem
