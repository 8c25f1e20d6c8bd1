// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON
// header padded with spaces to a multiple of 8, then the tensors' bytes back to back; and
// the memory-mapped view that validates the same header without reading the data.
#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/json.h"
#include "io/file.h"

namespace tandem {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

// Bytes of a tensor of this shape and element size, or nullopt when a dimension is negative
// or the size does not fit uint64.
std::optional<uint64_t> checked_bytes(const std::vector<int64_t>& shape, uint64_t esize) {
  uint64_t n = esize;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) n = 0;
  }
  for (int64_t d : shape) {
    if (n == 0) break;
    if (n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  TD_THROW("safetensors dtype '{}' is not supported (tandem reads and writes F32, F16, BF16, I32)",
           dtype);
}

bool SafeTensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const SafeTensor& t) { return t.name == name; });
}

const SafeTensor& SafeTensorsFile::get(const std::string& name) const {
  for (const SafeTensor& t : tensors)
    if (t.name == name) return t;
  TD_THROW("safetensors file '{}' has no tensor '{}' ({} tensors)", path, name, tensors.size());
}

void safetensors_write(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate, then lay the data out by descending element size (stable, so ties keep order).
  std::set<std::string> names;
  std::vector<size_t> layout(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafeTensor& t = tensors[i];
    TD_CHECK(!t.name.empty(), "cannot write safetensors file '{}': tensor {} has an empty name",
             path, i);
    TD_CHECK(t.name != kMetadataKey,
             "cannot write safetensors file '{}': '{}' is reserved and cannot name a tensor", path,
             kMetadataKey);
    TD_CHECK(names.insert(t.name).second,
             "cannot write safetensors file '{}': tensor name '{}' appears twice", path, t.name);
    const size_t esize = safetensors_dtype_size(t.dtype);
    const std::optional<uint64_t> need = checked_bytes(t.shape, esize);
    TD_CHECK(need.has_value(),
             "cannot write safetensors file '{}': tensor '{}' has bad shape {} (a negative "
             "dimension or too many elements)",
             path, t.name, shape_str(t.shape));
    TD_CHECK(*need == t.data.size(),
             "cannot write safetensors file '{}': tensor '{}' of shape {} and dtype {} needs {} "
             "bytes but holds {}",
             path, t.name, shape_str(t.shape), t.dtype, *need, t.data.size());
    layout[i] = i;
  }
  std::stable_sort(layout.begin(), layout.end(), [&](size_t a, size_t b) {
    return safetensors_dtype_size(tensors[a].dtype) > safetensors_dtype_size(tensors[b].dtype);
  });
  std::vector<std::pair<uint64_t, uint64_t>> offsets(tensors.size());
  uint64_t offset = 0;
  for (size_t i : layout) {
    offsets[i] = {offset, offset + tensors[i].data.size()};
    offset += tensors[i].data.size();
  }

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json meta = ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    header[tensors[i].name] = {{"dtype", tensors[i].dtype},
                               {"shape", tensors[i].shape},
                               {"data_offsets", {offsets[i].first, offsets[i].second}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    TD_THROW("cannot write safetensors file '{}': header is not valid JSON ({})", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TD_CHECK(out, "cannot create safetensors file '{}': {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i : layout) {
      out.write(reinterpret_cast<const char*>(tensors[i].data.data()),
                static_cast<std::streamsize>(tensors[i].data.size()));
    }
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      TD_THROW("cannot write safetensors file '{}': {}", tmp, why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    TD_THROW("cannot rename '{}' to safetensors file '{}': {}", tmp, path, ec.message());
  }
}

namespace {

// Bytes per element of every standard safetensors dtype; 0 for an unknown name.
uint64_t any_dtype_size(const std::string& dtype) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

bool whole_read_dtype(const std::string& dtype) {
  return dtype == "F32" || dtype == "F16" || dtype == "BF16" || dtype == "I32";
}

struct Header {
  std::vector<SafeTensorInfo> tensors;  // header order
  std::map<std::string, std::string> metadata;
};

// Validates the JSON header of `path` whose data section holds `buffer` bytes. any_dtype:
// every standard dtype is accepted (a mapped view), else only those read whole.
Header parse_header(const std::string& path, const std::string& text, uint64_t buffer,
                    bool any_dtype) {
  ordered_json header;
  try {
    header = json_parse_unique(text, fmt::format("safetensors file '{}' header", path));
  } catch (const Error& e) {
    TD_THROW("safetensors file '{}' has a bad JSON header: {}", path, e.message());
  }
  TD_CHECK(header.is_object(), "safetensors file '{}' has a bad JSON header: not an object", path);

  Header h;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      TD_CHECK(entry.is_object(), "safetensors file '{}': {} is not an object of strings", path,
               kMetadataKey);
      for (const auto& [key, value] : entry.items()) {
        TD_CHECK(value.is_string(), "safetensors file '{}': metadata '{}' is not a string", path,
                 key);
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    TD_CHECK(entry.is_object(), "safetensors file '{}': tensor '{}' entry is not an object", path,
             name);
    TD_CHECK(entry.contains("dtype") && entry["dtype"].is_string(),
             "safetensors file '{}': tensor '{}' has no string \"dtype\"", path, name);
    SafeTensorInfo t;
    t.name = name;
    t.dtype = entry["dtype"].get<std::string>();
    const uint64_t esize = any_dtype_size(t.dtype);
    TD_CHECK(esize > 0 && (any_dtype || whole_read_dtype(t.dtype)),
             "safetensors file '{}': tensor '{}' has dtype '{}', which tandem does not read "
             "(supported: F32, F16, BF16, I32)",
             path, name, t.dtype);
    TD_CHECK(entry.contains("shape") && entry["shape"].is_array(),
             "safetensors file '{}': tensor '{}' has no \"shape\" array", path, name);
    for (const auto& d : entry["shape"]) {
      TD_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0,
               "safetensors file '{}': tensor '{}' has bad shape {} (dimensions must be "
               "non-negative integers)",
               path, name, entry["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& offs = entry.contains("data_offsets") ? entry["data_offsets"] : ordered_json();
    TD_CHECK(offs.is_array() && offs.size() == 2 && offs[0].is_number_unsigned() &&
                 offs[1].is_number_unsigned(),
             "safetensors file '{}': tensor '{}' needs \"data_offsets\" [begin, end] of "
             "non-negative integers",
             path, name);
    for (const auto& [key, value] : entry.items())
      TD_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
               "safetensors file '{}': tensor '{}' has an unknown key '{}'", path, name, key);
    t.begin = offs[0].get<uint64_t>();
    t.end = offs[1].get<uint64_t>();
    TD_CHECK(t.begin <= t.end && t.end <= buffer,
             "safetensors file '{}': tensor '{}' data_offsets [{}, {}] are out of range (the "
             "data section holds {} bytes; truncated?)",
             path, name, t.begin, t.end, buffer);
    const std::optional<uint64_t> need = checked_bytes(t.shape, esize);
    TD_CHECK(need == t.end - t.begin,
             "safetensors file '{}': tensor '{}' of shape {} and dtype {} needs {} bytes, but its "
             "data_offsets [{}, {}] hold {}",
             path, name, shape_str(t.shape), t.dtype,
             need ? fmt::format("{}", *need) : std::string("too many"), t.begin, t.end,
             t.end - t.begin);
    h.tensors.push_back(std::move(t));
  }

  // The tensors must tile the data section exactly: no overlaps, no gaps, no trailing bytes.
  std::vector<const SafeTensorInfo*> sorted;
  for (const SafeTensorInfo& t : h.tensors) sorted.push_back(&t);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafeTensorInfo* prev = nullptr;
  for (const SafeTensorInfo* t : sorted) {
    TD_CHECK(t->begin >= covered,
             "safetensors file '{}': tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) "
             "overlap",
             path, prev->name, prev->begin, prev->end, t->name, t->begin, t->end);
    TD_CHECK(t->begin == covered,
             "safetensors file '{}': gap of {} bytes before tensor '{}' (its data begins at {}, "
             "the previous tensor's ends at {})",
             path, t->begin - covered, t->name, t->begin, covered);
    prev = t;
    covered = t->end;
  }
  TD_CHECK(covered == buffer,
           "safetensors file '{}' has {} trailing bytes after the last tensor's data", path,
           buffer - covered);
  return h;
}

uint64_t header_length(const std::string& path, const uint8_t* length, uint64_t size) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  TD_CHECK(n <= size - 8,
           "safetensors file '{}' is truncated (or not a safetensors file): header length {} "
           "bytes, but only {} bytes follow",
           path, n, size - 8);
  return n;
}

}  // namespace

SafeTensorsFile safetensors_read(const std::string& path) {
  std::error_code ec;
  TD_CHECK(!std::filesystem::is_directory(path, ec), "safetensors file '{}' is a directory", path);
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in, "safetensors file '{}' cannot be opened: {}", path, std::strerror(errno));
  const uint64_t size = std::filesystem::file_size(path, ec);
  TD_CHECK(!ec, "safetensors file '{}': cannot get its size: {}", path, ec.message());
  TD_CHECK(size >= 8,
           "safetensors file '{}' is truncated: {} bytes, shorter than the 8-byte header length",
           path, size);

  uint8_t length[8];
  in.read(reinterpret_cast<char*>(length), 8);
  TD_CHECK(in, "safetensors file '{}': cannot read the header length: {}", path,
           std::strerror(errno));
  const uint64_t n = header_length(path, length, size);
  std::string text(static_cast<size_t>(n), '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  TD_CHECK(in, "safetensors file '{}': cannot read the header: {}", path, std::strerror(errno));
  Header h = parse_header(path, text, size - 8 - n, false);

  SafeTensorsFile file;
  file.path = path;
  file.metadata = std::move(h.metadata);
  for (const SafeTensorInfo& info : h.tensors) {
    SafeTensor t;
    t.name = info.name;
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.data.resize(static_cast<size_t>(info.end - info.begin));
    in.seekg(static_cast<std::streamoff>(8 + n + info.begin));
    in.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    TD_CHECK(in, "safetensors file '{}': cannot read tensor '{}': {}", path, t.name,
             std::strerror(errno));
    file.tensors.push_back(std::move(t));
  }
  return file;
}

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafeTensorsMap::SafeTensorsMap(const std::string& path) {
  file_ = std::make_unique<MappedFile>(path);
  const uint64_t size = file_->size();
  TD_CHECK(size >= 8,
           "safetensors file '{}' is truncated: {} bytes, shorter than the 8-byte header length",
           path, size);
  const uint64_t n = header_length(path, file_->data(), size);
  const std::string text(reinterpret_cast<const char*>(file_->data()) + 8, static_cast<size_t>(n));
  Header h = parse_header(path, text, size - 8 - n, true);
  data_start_ = 8 + n;
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafeTensorInfo* SafeTensorsMap::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tandem
