// Strict JSON parsing: nlohmann's parser with a callback that records the keys of every
// open object, so that a repeated key is reported instead of silently overriding.
#include "core/json.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace tandem {

namespace {

// One open container of the document being parsed: an object with the keys seen so far
// and the last of them, or an array.
struct Frame {
  bool object = false;
  std::set<std::string> keys;
  std::string key;
};

// Where the innermost container sits: "model", "units[].name", or "" at the top level.
std::string frames_path(const std::vector<Frame>& frames) {
  std::string path;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    if (frames[i].object) {
      path += (path.empty() ? "" : ".") + frames[i].key;
    } else {
      path += "[]";
    }
  }
  return path;
}

template <typename Json>
Json parse_strict(const std::string& text, const std::string& what) {
  using Event = typename Json::parse_event_t;
  std::vector<Frame> frames;
  std::string duplicate, where;
  const typename Json::parser_callback_t track = [&](int, Event event, Json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        frames.push_back(Frame{event == Event::object_start, {}, {}});
        break;
      case Event::object_end:
      case Event::array_end:
        frames.pop_back();
        break;
      case Event::key: {
        Frame& f = frames.back();
        f.key = parsed.template get<std::string>();
        if (!f.keys.insert(f.key).second && duplicate.empty()) {
          duplicate = f.key;
          where = frames_path(frames);
        }
        break;
      }
      case Event::value:
        break;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, track);
  } catch (const nlohmann::json::exception& e) {
    TD_THROW("{} is not valid JSON: {}", what, e.what());
  }
  TD_CHECK(duplicate.empty(), "{} has the key '{}' twice{}", what, duplicate,
           where.empty() ? std::string() : fmt::format(" (in '{}')", where));
  return j;
}

}  // namespace

nlohmann::json json_parse(const std::string& text, const std::string& what) {
  return parse_strict<nlohmann::json>(text, what);
}

nlohmann::ordered_json json_parse_ordered(const std::string& text, const std::string& what) {
  return parse_strict<nlohmann::ordered_json>(text, what);
}

nlohmann::json json_read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  TD_CHECK(std::filesystem::is_regular_file(path, ec), "cannot open {} '{}': not a regular file",
           what, path);
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in.good(), "cannot open {} '{}': {}", what, path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  TD_CHECK(!in.bad(), "cannot read {} '{}': {}", what, path, std::strerror(errno));
  return json_parse(text.str(), fmt::format("{} '{}'", what, path));
}

}  // namespace tandem
