// Tests of the safetensors reader and writer: round trips, a file laid out by hand as the
// reference implementation writes it, and a clear tandem::Error for each malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

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

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file: 8-byte little-endian length, the header text as given, the data.
void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data,
               uint64_t length_override = ~uint64_t{0}) {
  const uint64_t n = length_override == ~uint64_t{0} ? header.size() : length_override;
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<SafeTensor> sample_tensors() {
  return {
      {"wte", "F32", {3, 2}, bytes_of(std::vector<float>{1.5f, -2.f, 0.f, 3.25f, 1e-3f, -7.f})},
      {"norm.weight", "BF16", {3}, bytes_of(std::vector<uint16_t>{0x3f80, 0xc000, 0x0000})},
      {"step", "I32", {}, bytes_of(std::vector<int32_t>{-12345})},
      {"empty", "F32", {0, 4}, {}},
      {"blocks.0.w", "F32", {2}, bytes_of(std::vector<float>{4.f, 5.f})},
  };
}

TEST(SafeTensors, RoundTrip) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const std::vector<SafeTensor> tensors = sample_tensors();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"tandem", "gpt2 d=4"}};
  safetensors_write(path, tensors, meta);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const SafeTensorsFile file = safetensors_read(path);
  EXPECT_EQ(file.path, path);
  EXPECT_EQ(file.metadata, meta);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafeTensor& t = file.tensors[i];  // header order is the order written
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.dtype, tensors[i].dtype);
    EXPECT_EQ(t.shape, tensors[i].shape);
    EXPECT_EQ(t.data, tensors[i].data);
    EXPECT_EQ(&file.get(t.name), &t);
  }
  EXPECT_EQ(file.get("step").numel(), 1);
  EXPECT_EQ(file.get("empty").numel(), 0);
  EXPECT_TRUE(file.contains("wte"));
  EXPECT_FALSE(file.contains("wpe"));
  const std::string msg = error_of([&] { file.get("wpe"); });
  EXPECT_CONTAINS(msg, "has no tensor 'wpe'");
  EXPECT_CONTAINS(msg, "w.safetensors");
}

TEST(SafeTensors, HeaderLayout) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  safetensors_write(path, sample_tensors(), {{"k", "v"}});
  const std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  EXPECT_CONTAINS(header, "\"__metadata__\":{\"k\":\"v\"}");
  // Data: 4-byte dtypes first, in the given order, then the BF16 tensor.
  EXPECT_CONTAINS(header, "\"wte\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}");
  EXPECT_CONTAINS(header, "\"step\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[24,28]}");
  EXPECT_CONTAINS(header, "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[28,28]}");
  EXPECT_CONTAINS(header,
                  "\"blocks.0.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[28,36]}");
  EXPECT_CONTAINS(header,
                  "\"norm.weight\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[36,42]}");
  EXPECT_EQ(bytes.size(), 8 + n + 42);
}

TEST(SafeTensors, ReadsReferenceLayout) {
  // Laid out as huggingface/safetensors writes it: metadata first, header padded with spaces.
  TempDir dir;
  const std::string path = dir.file("ref.safetensors");
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> data = bytes_of(std::vector<int32_t>{1, 2, 3, 4});
  data.push_back(0x80);
  data.push_back(0x3f);
  write_raw(path, header, data);
  const SafeTensorsFile file = safetensors_read(path);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.get("a").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(file.get("a").data, bytes_of(std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(file.get("b").data, (std::vector<uint8_t>{0x80, 0x3f}));
  // Data need not follow header order.
  write_raw(path,
            R"({"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]},)"
            R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
            bytes_of(std::vector<int32_t>{10, 20}));
  const SafeTensorsFile swapped = safetensors_read(path);
  EXPECT_EQ(swapped.tensors[0].name, "b");
  EXPECT_EQ(swapped.get("b").data, bytes_of(std::vector<int32_t>{20}));
  EXPECT_EQ(swapped.get("a").data, bytes_of(std::vector<int32_t>{10}));
}

TEST(SafeTensors, WriteRejectsBadTensors) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const auto write = [&](std::vector<SafeTensor> t) { safetensors_write(path, t, {}); };
  EXPECT_CONTAINS(error_of([&] {
                    write({{"a", "F32", {2}, std::vector<uint8_t>(4)}});
                  }),
                  "tensor 'a' of shape [2] and dtype F32 needs 8 bytes but holds 4");
  EXPECT_CONTAINS(error_of([&] {
                    write({{"a", "F64", {1}, std::vector<uint8_t>(8)}});
                  }),
                  "dtype 'F64' is not supported");
  EXPECT_CONTAINS(error_of([&] {
                    write({{"a", "I32", {1}, std::vector<uint8_t>(4)},
                           {"a", "I32", {1}, std::vector<uint8_t>(4)}});
                  }),
                  "tensor name 'a' appears twice");
  EXPECT_CONTAINS(error_of([&] {
                    write({{"", "I32", {1}, std::vector<uint8_t>(4)}});
                  }),
                  "empty name");
  EXPECT_CONTAINS(error_of([&] {
                    write({{"__metadata__", "I32", {1}, std::vector<uint8_t>(4)}});
                  }),
                  "reserved");
  EXPECT_CONTAINS(error_of([&] { write({{"a", "I32", {-1}, {}}}); }), "bad shape [-1]");
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafeTensors, TooShortOrTruncated) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  std::string msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "bad.safetensors");
  EXPECT_CONTAINS(msg, "truncated: 3 bytes");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", {}, 1000);
  msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "truncated");
  EXPECT_CONTAINS(msg, "header length 1000 bytes");
  // Header intact, data cut short.
  write_raw(path, R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", {1, 2, 3, 4});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "out of range");
  EXPECT_CONTAINS(error_of([&] { safetensors_read(dir.file("missing.safetensors")); }),
                  "cannot be opened");
}

TEST(SafeTensors, BadJson) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, R"({"a":{"dtype":"I32",)", {});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "header is not valid JSON");
  write_raw(path, "[1, 2]", {});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "bad JSON header: not an object");
  write_raw(path, R"({"a": 5})", {});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "tensor 'a' entry is not an object");
  write_raw(path, R"({"a":{"shape":[1],"data_offsets":[0,4]}})", {0, 0, 0, 0});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "no string \"dtype\"");
  write_raw(path, R"({"a":{"dtype":"I32","data_offsets":[0,4]}})", {0, 0, 0, 0});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "no \"shape\" array");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0]}})", {0, 0, 0, 0});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "needs \"data_offsets\"");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[-1],"data_offsets":[0,4]}})", {0, 0, 0, 0});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "bad shape [-1]");
  write_raw(path, R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
            std::vector<uint8_t>(8));
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "dtype 'F64', which tandem does not");
  write_raw(path, R"({"__metadata__":{"n":3}})", {});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "metadata 'n' is not a string");
}

// nlohmann keeps the last of two equal keys; the reader refuses them, naming file and key.
TEST(SafeTensors, DuplicateKeys) {
  TempDir dir;
  const std::string path = dir.file("dup.safetensors");
  write_raw(path,
            R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
            {0, 0, 0, 0});
  std::string msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "dup.safetensors");
  EXPECT_CONTAINS(msg, "has the key 'a' twice");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[1],"shape":[2],"data_offsets":[0,4]}})",
            {0, 0, 0, 0});
  msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "has the key 'shape' twice (in 'a')");
  write_raw(path, R"({"__metadata__":{"k":"1","k":"2"}})", {});
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }),
                  "has the key 'k' twice (in '__metadata__')");
}

TEST(SafeTensors, BadOffsets) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::vector<uint8_t> data(16);
  write_raw(path, R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[12,20]}})", data);
  std::string msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "tensor 'a' data_offsets [12, 20] are out of range");
  EXPECT_CONTAINS(msg, "holds 16 bytes");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[8,4]}})", data);
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "out of range");
  write_raw(path,
            R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"I32","shape":[3],"data_offsets":[4,16]}})",
            data);
  msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 16)) overlap");
  write_raw(path,
            R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"I32","shape":[1],"data_offsets":[12,16]}})",
            data);
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "gap of 4 bytes before tensor 'b'");
  write_raw(path, R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", data);
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "has 8 trailing bytes");
}

TEST(SafeTensors, ShapeDisagreesWithBytes) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
            std::vector<uint8_t>(20));
  std::string msg = error_of([&] { safetensors_read(path); });
  EXPECT_CONTAINS(msg, "tensor 'w' of shape [2, 3] and dtype F32 needs 24 bytes");
  EXPECT_CONTAINS(msg, "data_offsets [0, 20] hold 20");
  write_raw(path, R"({"w":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,2]}})",
            std::vector<uint8_t>(2));
  EXPECT_CONTAINS(error_of([&] { safetensors_read(path); }), "needs too many bytes");
}

}  // namespace
}  // namespace tandem
