// tandem::Model: a model loaded for inference, from a tandem checkpoint or a Hugging Face
// model directory, on one device. It generates with a KV cache (the decoder of `tandem
// generate`), scores a sequence (the logits of every position) and lays its weights open
// under their Hugging Face names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/config.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "tandem/tokenizer.h"

namespace tandem::api {

struct LoadOptions {
  Device device = Device::cpu;
  int batch = 1;  // sequences one generate() call may hold
  // Positions of the KV cache per sequence: prompt and new tokens together; 0: the model's
  // context.
  int max_seq = 0;
  uint64_t mem_limit_bytes = 0;  // memory the model may hold; 0: the device's free memory
};

struct GenerateOptions {
  int max_new_tokens = 64;   // per sequence, capped to what fits in max_seq
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // sample among the k likeliest tokens; 0: all
  float top_p = 1.0f;        // nucleus, in (0, 1]
  uint64_t seed = 1;
  // A sequence ends once its new text contains this (needs the model's tokenizer).
  std::string stop;
  bool ignore_eos = false;  // keep going past the model's end-of-sequence tokens
  // Sees each new token of sequence `sequence` as it is made, before the next step;
  // returning false ends that sequence.
  std::function<bool(int sequence, uint32_t token)> on_token;
};

struct Generation {
  std::vector<std::vector<uint32_t>> ids;  // the new tokens of each sequence
  // The new text of each sequence, where the model has a tokenizer; empty otherwise.
  std::vector<std::string> text;
  std::vector<std::string> finish;  // "length", "eos" or "stop" per sequence
  int64_t prompt_tokens = 0;
  double time_to_first_token_ms = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  uint64_t peak_mem_bytes = 0;  // what the model holds on its device
};

// One tensor of the model under its Hugging Face name, as a strided fp32 view: element
// (i0, i1, ...) is data[i0 * strides[0] + i1 * strides[1] + ...] (strides in elements).
// On the CPU the view is the model's own memory: writing it changes what the model
// computes. On a GPU, `data` points at a host copy that the Model owns (read-only: writes
// do not reach the device). GPT-NeoX's fused query_key_value tensors are viewed as
// [heads, 3, head_dim, ...], the Hugging Face row order (head, q|k|v, channel) made
// explicit, since tandem keeps their rows as (q|k|v, head, channel).
struct ParameterView {
  std::string name;
  float* data = nullptr;
  std::vector<int64_t> shape, strides;
  bool writable = false;  // the model reads what is written
};

class Model {
 public:
  // Opens a tandem checkpoint or a Hugging Face model directory, reads its weights onto the
  // device and plans the KV cache for options.batch sequences of options.max_seq positions.
  // Throws tandem::Error for a damaged directory or a plan over the memory limit, saying
  // by how much.
  static Model load(const std::filesystem::path& dir, const LoadOptions& options = {});
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  const LoadOptions& options() const;  // as resolved: max_seq filled in
  // "tandem checkpoint (step 100)" or "Hugging Face LlamaForCausalLM".
  std::string describe() const;
  // The directory's tokenizer (or the byte tokenizer of a byte-vocabulary model); empty
  // when the directory holds none.
  const std::optional<Tokenizer>& tokenizer() const;
  // The model's end-of-sequence ids (its config's and its tokenizer's).
  std::vector<uint32_t> eos_ids() const;

  // Continues each prompt (1 to options().batch of them, each non-empty) by up to
  // options.max_new_tokens tokens. Throws for an empty prompt, a token outside the
  // vocabulary, too many prompts, a prompt that leaves no room in max_seq, or sampling
  // settings out of range.
  Generation generate(const std::vector<std::vector<uint32_t>>& prompts,
                      const GenerateOptions& options = {});
  // The next-token logits at every position of `ids` (teacher-forced through the same
  // decoder as generate): [ids.size(), vocab] row-major, fp32.
  std::vector<float> logits(const std::vector<uint32_t>& ids);
  // Every tensor under its Hugging Face name, in the Hugging Face state dict's order (a
  // tied head appears once, as the embedding). Valid while the Model lives.
  std::vector<ParameterView> parameters();

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
