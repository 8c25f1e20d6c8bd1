// The tandem side of bench/decode_gpu.sh: opens a model directory once (a tandem checkpoint or
// a Hugging Face directory: the import is timed), then decodes each batch size in turn with
// one decoder of as many slots as the largest, greedy, EOS ignored, a random prompt of P
// tokens copied to every sequence, and prints one JSON line per batch size.
//
//   tandem_decode_bench DIR --batches 1,8,32 --prompt 128 --new 256 [--device cuda]
//                       [--no-graphs] [--repeat 2] [--run-ahead on|off|both]
// With --run-ahead both, each batch size is decoded by a decoder of each setting in turn (one
// import), and each line names its setting.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/device.h"
#include "infer/decoder.h"
#include "io/model_source.h"

int main(int argc, char** argv) {
  using namespace tandem;
  try {
    TD_CHECK(argc >= 2,
             "usage: {} DIR [--batches 1,8,32] [--prompt P] [--new N] [--device cuda] "
             "[--no-graphs] [--repeat R] [--run-ahead on|off|both]",
             argv[0]);
    std::string dir = argv[1], batches = "1,8,32", device_name = "cuda", ahead = "on";
    int prompt = 128, fresh = 256, repeat = 2;
    bool graphs = true;
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        TD_CHECK(i + 1 < argc, "{} needs a value", a);
        return argv[++i];
      };
      if (a == "--batches")
        batches = next();
      else if (a == "--prompt")
        prompt = std::stoi(next());
      else if (a == "--new")
        fresh = std::stoi(next());
      else if (a == "--device")
        device_name = next();
      else if (a == "--repeat")
        repeat = std::stoi(next());
      else if (a == "--no-graphs")
        graphs = false;
      else if (a == "--run-ahead")
        ahead = next();
      else
        TD_THROW("unknown argument {}", a);
    }
    TD_CHECK(ahead == "on" || ahead == "off" || ahead == "both",
             "--run-ahead is on, off or both, got '{}'", ahead);
    std::vector<int> bs;
    std::stringstream in(batches);
    for (std::string item; std::getline(in, item, ',');) bs.push_back(std::stoi(item));
    const int slots = *std::max_element(bs.begin(), bs.end());

    const auto t0 = std::chrono::steady_clock::now();
    const auto source = ModelSource::open(dir);
    const ModelConfig& c = source->config();
    const ModelLayout model(c);
    const auto device = device_create(device_kind_parse(device_name));
    // One decoder per setting, from one import; the settings take turns at each batch size.
    std::vector<bool> settings;
    if (ahead != "off") settings.push_back(true);
    if (ahead != "on") settings.push_back(false);
    std::vector<std::unique_ptr<Decoder>> decoders;
    {
      const auto params = source->load_params();
      for (const bool on : settings) {
        DecoderOptions o;
        o.batch = slots;
        o.max_seq = prompt + fresh;
        o.graphs = graphs;
        o.run_ahead = on;
        decoders.push_back(std::make_unique<Decoder>(model, *device, params, o));
      }
    }
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    std::vector<int32_t> ids;
    uint64_t s = 1;
    for (int i = 0; i < prompt; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>(3 + (s >> 33) % static_cast<uint64_t>(c.vocab - 3)));
    }
    for (int B : bs)
      for (size_t d = 0; d < decoders.size(); ++d) {
        Decoder& decoder = *decoders[d];
        GenerateRequest r;
        r.prompts.assign(static_cast<size_t>(B), ids);
        r.tokens = fresh;
        r.sampling.temperature = 0;
        r.ignore_eos = true;
        GenerateResult best;
        for (int k = 0; k < repeat; ++k) {  // the first run also captures the graph
          const GenerateResult g = decoder.generate(r);
          if (k == 0 || g.decode_tokens_per_s() > best.decode_tokens_per_s()) best = g;
        }
        nlohmann::ordered_json j;
        j["what"] = "tandem";
        j["model"] = dir;
        j["batch"] = B;
        j["prompt"] = prompt;
        j["new"] = fresh;
        j["time_to_first_token_ms"] = best.time_to_first_token_ms;
        j["prefill_tokens_per_s"] = best.prefill_tokens_per_s();
        j["decode_tokens_per_s"] = best.decode_tokens_per_s();
        j["decode_steps"] = best.decode_steps;
        j["peak_mem_bytes"] = decoder.memory().total();
        j["params_bytes"] = decoder.memory().params;
        j["cuda_graph"] = decoder.graphs_used();
        j["run_ahead"] = settings[d];
        j["load_s"] = load_s;
        fmt::print("{}\n", j.dump());
        std::fflush(stdout);
      }
  } catch (const tandem::Error& e) {
    fmt::print(stderr, "tandem_decode_bench: error: {}\n", e.message());
    return 1;
  }
  return 0;
}
