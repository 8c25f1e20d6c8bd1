// Tests of the token file format (tandem and llm.c), the byte tokenizer and data_prepare:
// round trips, hand-written files, and a clear tandem::Error for every malformed input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/prepare.h"
#include "io/tokenizer.h"
#include "io/tokens.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            fmt::format("tandem_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// The message of the tandem::Error f throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected a tandem::Error";
  return "";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_le(std::vector<uint8_t>& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

// A tandem token file byte by byte: header fields as given, then `body` bytes.
std::vector<uint8_t> tandem_file(uint32_t version, uint32_t width, uint64_t count,
                                 uint64_t reserved, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> b(kTokensMagic, kTokensMagic + 8);
  put_le(b, version, 4);
  put_le(b, width, 4);
  put_le(b, count, 8);
  put_le(b, reserved, 8);
  b.insert(b.end(), body.begin(), body.end());
  return b;
}

// An llm.c .bin file: 256 int32 of header, then uint16 tokens.
std::vector<uint8_t> llmc_file(int32_t magic, int32_t version, int32_t count,
                               const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b;
  put_le(b, static_cast<uint32_t>(magic), 4);
  put_le(b, static_cast<uint32_t>(version), 4);
  put_le(b, static_cast<uint32_t>(count), 4);
  for (int i = 3; i < 256; ++i) put_le(b, 0, 4);
  for (uint16_t t : tokens) put_le(b, t, 2);
  return b;
}

TEST(Tokens, RoundTripUint16) {
  TempDir dir;
  const std::string path = dir.file("a.tok");
  const std::vector<uint32_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  tokens_write(path, tokens, 2);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // The exact bytes: header then little-endian uint16.
  std::vector<uint8_t> body;
  for (uint32_t t : tokens) put_le(body, t, 2);
  EXPECT_EQ(read_bytes(path), tandem_file(1, 2, tokens.size(), 0, body));

  const TokenData data = tokens_read(path);
  EXPECT_EQ(data.tokens, tokens);
  EXPECT_EQ(data.token_bytes, 2);
  EXPECT_EQ(data.format, "tandem");
}

TEST(Tokens, RoundTripUint32) {
  TempDir dir;
  const std::string path = dir.file("a.tok");
  const std::vector<uint32_t> tokens = {0, 65536, 128000, 0xffffffffu, 3};
  tokens_write(path, tokens, 4);
  EXPECT_EQ(fs::file_size(path), 32u + 4u * tokens.size());
  const TokenData data = tokens_read(path);
  EXPECT_EQ(data.tokens, tokens);
  EXPECT_EQ(data.token_bytes, 4);
  EXPECT_EQ(data.format, "tandem");
}

TEST(Tokens, LargeFileCrossesReadChunks) {
  TempDir dir;
  const std::string path = dir.file("big.tok");
  std::vector<uint32_t> tokens((1u << 20) + 12345);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  tokens_write(path, tokens, 4);
  EXPECT_EQ(tokens_read(path).tokens, tokens);
  for (auto& t : tokens) t &= 0xffff;
  tokens_write(path, tokens, 2);  // overwrites the existing file
  EXPECT_EQ(tokens_read(path).tokens, tokens);
}

TEST(Tokens, MinWidth) {
  EXPECT_EQ(tokens_min_width(0), 2);
  EXPECT_EQ(tokens_min_width(65535), 2);
  EXPECT_EQ(tokens_min_width(65536), 4);
  EXPECT_EQ(tokens_min_width(0xffffffffu), 4);
}

TEST(Tokens, WriteRejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("a.tok");
  std::string msg = error_of([&] { tokens_write(path, {1, 2, 70000, 3}, 2); });
  EXPECT_CONTAINS(msg, "token 70000 at position 2");
  EXPECT_CONTAINS(msg, "a.tok");
  EXPECT_FALSE(fs::exists(path));
  msg = error_of([&] { tokens_write(path, {1, 2}, 3); });
  EXPECT_CONTAINS(msg, "bad token width 3");
  msg = error_of([&] { tokens_write(path, {}, 2); });
  EXPECT_CONTAINS(msg, "zero tokens");
  msg = error_of([&] { tokens_write(dir.file("no/such/dir/a.tok"), {1}, 2); });
  EXPECT_CONTAINS(msg, "cannot create");
}

TEST(Tokens, ReadsLlmcFile) {
  TempDir dir;
  const std::string path = dir.file("train.bin");
  const std::vector<uint16_t> tokens = {50256, 464, 2068, 7586, 21831, 0, 65535};
  write_bytes(path, llmc_file(20240520, 1, static_cast<int32_t>(tokens.size()), tokens));
  const TokenData data = tokens_read(path);
  EXPECT_EQ(data.format, "llm.c");
  EXPECT_EQ(data.token_bytes, 2);
  EXPECT_EQ(data.tokens, std::vector<uint32_t>(tokens.begin(), tokens.end()));
}

TEST(Tokens, MissingFile) {
  TempDir dir;
  const std::string msg = error_of([&] { tokens_read(dir.file("nope.tok")); });
  EXPECT_CONTAINS(msg, "nope.tok");
  EXPECT_CONTAINS(msg, "cannot be opened");
  EXPECT_CONTAINS(msg, "No such file");
  EXPECT_CONTAINS(error_of([&] { tokens_read(dir.file("")); }), "directory");
}

TEST(Tokens, ShorterThanHeader) {
  TempDir dir;
  const std::string path = dir.file("short.tok");
  write_bytes(path, {});
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "0 bytes, shorter than any token file");
  write_bytes(path, {'T', 'N', 'D'});
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "3 bytes, shorter than any token file");
  std::vector<uint8_t> b = tandem_file(1, 2, 1, 0, {});
  b.resize(20);
  write_bytes(path, b);
  std::string msg = error_of([&] { tokens_read(path); });
  EXPECT_CONTAINS(msg, "20 bytes, shorter than the 32-byte tandem token header");
  EXPECT_CONTAINS(msg, "short.tok");
  b = llmc_file(20240520, 1, 1, {1});
  b.resize(100);
  write_bytes(path, b);
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }),
                  "100 bytes, shorter than the 1024-byte llm.c header");
}

TEST(Tokens, UnknownMagic) {
  TempDir dir;
  const std::string path = dir.file("x.tok");
  write_bytes(path, std::vector<uint8_t>(64, 'A'));
  const std::string msg = error_of([&] { tokens_read(path); });
  EXPECT_CONTAINS(msg, "x.tok");
  EXPECT_CONTAINS(msg, "unknown magic");
  EXPECT_CONTAINS(msg, "41 41 41 41");
  EXPECT_CONTAINS(msg, "tandem token files");
  EXPECT_CONTAINS(msg, "llm.c");
  EXPECT_CONTAINS(msg, "20240520");
}

TEST(Tokens, UnsupportedVersion) {
  TempDir dir;
  const std::string path = dir.file("v.tok");
  write_bytes(path, tandem_file(2, 2, 1, 0, {1, 0}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "unsupported tandem token file version 2");
  write_bytes(path, llmc_file(20240520, 3, 1, {1}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "unsupported llm.c version 3");
}

TEST(Tokens, BadTokenWidth) {
  TempDir dir;
  const std::string path = dir.file("w.tok");
  write_bytes(path, tandem_file(1, 3, 1, 0, {1, 0, 0}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "bad token width 3 bytes");
  write_bytes(path, tandem_file(1, 0, 1, 0, {}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "bad token width 0 bytes");
}

TEST(Tokens, ReservedMustBeZero) {
  TempDir dir;
  const std::string path = dir.file("r.tok");
  write_bytes(path, tandem_file(1, 2, 1, 5, {1, 0}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "reserved header field 5");
}

TEST(Tokens, TruncatedBody) {
  TempDir dir;
  const std::string path = dir.file("t.tok");
  write_bytes(path, tandem_file(1, 2, 1000, 0, std::vector<uint8_t>(1996, 0)));
  std::string msg = error_of([&] { tokens_read(path); });
  EXPECT_CONTAINS(msg, "'" + path + "' is truncated");
  EXPECT_CONTAINS(msg, "header says 1000 tokens (2000 bytes)");
  EXPECT_CONTAINS(msg, "file holds 1996 bytes after the header (998 whole tokens)");
  write_bytes(path, tandem_file(1, 4, 10, 0, std::vector<uint8_t>(39, 0)));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "holds 39 bytes after the header");
  // A huge count must not overflow the size computation.
  write_bytes(path, tandem_file(1, 4, ~uint64_t{0}, 0, {1, 2, 3, 4}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "truncated");
  write_bytes(path, llmc_file(20240520, 1, 5, {1, 2, 3}));
  msg = error_of([&] { tokens_read(path); });
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "header says 5 tokens (10 bytes)");
  write_bytes(path, llmc_file(20240520, 1, -4, {1, 2, 3}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "negative token count -4");
}

TEST(Tokens, TrailingBytes) {
  TempDir dir;
  const std::string path = dir.file("t.tok");
  write_bytes(path, tandem_file(1, 2, 2, 0, {1, 0, 2, 0, 9}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }),
                  "has 1 trailing bytes after the 2 tokens its header announces");
  write_bytes(path, llmc_file(20240520, 1, 2, {1, 2, 3}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "2 trailing bytes");
}

TEST(Tokens, ZeroTokens) {
  TempDir dir;
  const std::string path = dir.file("z.tok");
  write_bytes(path, tandem_file(1, 2, 0, 0, {}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "holds zero tokens");
  write_bytes(path, llmc_file(20240520, 1, 0, {}));
  EXPECT_CONTAINS(error_of([&] { tokens_read(path); }), "holds zero tokens");
}

TEST(Tokenizer, RoundTripsEveryByte) {
  ByteTokenizer tok;
  EXPECT_EQ(ByteTokenizer::kVocab, 256);
  EXPECT_EQ(tok.vocab(), 256);
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  all += all;
  const std::vector<uint32_t> tokens = tok.encode(all);
  ASSERT_EQ(tokens.size(), 512u);
  for (int i = 0; i < 512; ++i) EXPECT_EQ(tokens[i], static_cast<uint32_t>(i % 256));
  EXPECT_EQ(tok.decode(tokens), all);
}

TEST(Tokenizer, NonAscii) {
  ByteTokenizer tok;
  const std::string text = "h\xc3\xa9llo, \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x9a\x80 \xff\xfe";
  const std::vector<uint32_t> tokens = tok.encode(text);
  EXPECT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[1], 0xc3u);
  EXPECT_EQ(tokens[2], 0xa9u);
  EXPECT_EQ(tok.decode(tokens), text);
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode(std::vector<uint32_t>{}), "");
}

TEST(Tokenizer, DecodeRejectsTokensOutsideVocab) {
  ByteTokenizer tok;
  const std::string msg = error_of([&] { tok.decode(std::vector<uint32_t>{104, 105, 256}); });
  EXPECT_CONTAINS(msg, "token 256 at position 2");
  EXPECT_CONTAINS(msg, "vocabulary is 256");
}

TEST(Prepare, ConcatenatesWithNewlines) {
  TempDir dir;
  const auto text = [&](const std::string& name, const std::string& content) {
    write_bytes(dir.file(name), std::vector<uint8_t>(content.begin(), content.end()));
    return dir.file(name);
  };
  const std::vector<std::string> files = {text("a.txt", "ab"), text("b.txt", "cd\n"),
                                          text("empty.txt", ""), text("c.txt", "ef"),
                                          text("d.txt", "\xc3\xa9")};
  const std::string out = dir.file("out.tok");
  const PrepareReport report = data_prepare(files, out);
  EXPECT_EQ(report.files, 5u);
  EXPECT_EQ(report.bytes, 9u);
  EXPECT_EQ(report.tokens, 11u);

  const TokenData data = tokens_read(out);
  EXPECT_EQ(data.format, "tandem");
  EXPECT_EQ(data.token_bytes, 2);
  EXPECT_EQ(ByteTokenizer().decode(data.tokens), "ab\ncd\nef\n\xc3\xa9");
}

TEST(Prepare, Errors) {
  TempDir dir;
  const std::string out = dir.file("out.tok");
  write_bytes(dir.file("a.txt"), {'h', 'i'});
  write_bytes(dir.file("e.txt"), {});

  std::string msg = error_of([&] { data_prepare({dir.file("a.txt"), dir.file("gone.txt")}, out); });
  EXPECT_CONTAINS(msg, "cannot read text file");
  EXPECT_CONTAINS(msg, "gone.txt");
  EXPECT_CONTAINS(error_of([&] { data_prepare({dir.file("")}, out); }), "is a directory");
  EXPECT_CONTAINS(error_of([&] { data_prepare({}, out); }), "no text files given");
  msg = error_of([&] { data_prepare({dir.file("e.txt"), dir.file("e.txt")}, out); });
  EXPECT_CONTAINS(msg, "all empty");
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace tandem
