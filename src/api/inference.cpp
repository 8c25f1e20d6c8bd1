// tandem::Model of the public API: a model source, its decoder on one device, its tokenizer.
#include <tandem/inference.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "api/convert.h"
#include "api/environment.h"
#include "api/errors.h"
#include "api/tokenizer_impl.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "infer/decoder.h"
#include "infer/sequence_text.h"
#include "io/hf.h"
#include "io/model_source.h"
#include "io/tokenizer.h"

namespace tandem::api {

struct Model::Impl {
  LoadOptions options;
  std::unique_ptr<::tandem::ModelSource> source;
  std::unique_ptr<::tandem::ModelLayout> layout;
  ModelInfo info;
  std::optional<Tokenizer> public_tok;       // empty: the directory holds none
  const ::tandem::Tokenizer* tok = nullptr;  // public_tok's
  std::vector<int32_t> eos;
  // Declared before the decoder, which holds memory of the device.
  std::unique_ptr<::tandem::Device> device;
  std::unique_ptr<::tandem::Decoder> decoder;
  std::vector<std::vector<float>> host_copies;  // parameters() of a GPU model
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

Model Model::load(const std::filesystem::path& dir, const LoadOptions& options) {
  return translate_errors([&] {
    const ::tandem::Environment env = ::tandem::environment_from_process();
    auto m = std::make_unique<Impl>();
    m->options = options;
    TD_CHECK(options.batch > 0, "batch must be positive, got {}", options.batch);
    TD_CHECK(options.max_seq >= 0, "max_seq must not be negative, got {}", options.max_seq);
    m->source = ::tandem::ModelSource::open(dir.string());
    const ::tandem::ModelConfig& c = m->source->config();
    TD_CHECK(options.max_seq <= c.context, "max_seq {} is over model '{}''s context of {}",
             options.max_seq, c.name, c.context);
    m->options.max_seq = options.max_seq > 0 ? options.max_seq : c.context;
    m->layout = std::make_unique<::tandem::ModelLayout>(c);
    m->info = model_info(c, m->source->step());

    // The tokenizer: the directory's, or the byte one for a byte-vocabulary model.
    auto t = std::make_shared<Tokenizer::Impl>();
    if (!::tandem::tokenizer_find(dir.string()).empty())
      t->t = ::tandem::tokenizer_load(dir.string());
    else if (c.vocab == ::tandem::ByteTokenizer::kVocab)
      t->t = std::make_unique<::tandem::ByteTokenizer>();
    if (t->t) {
      TD_CHECK(t->t->vocab_size() <= static_cast<size_t>(c.vocab),
               "model '{}' of '{}' has a vocabulary of {}, smaller than its {} tokenizer's {}",
               c.name, dir.string(), c.vocab, t->t->kind(), t->t->vocab_size());
      m->tok = t->t.get();
      m->public_tok = Tokenizer(std::move(t));
    }
    for (int64_t e : m->source->tokens().eos) m->eos.push_back(static_cast<int32_t>(e));
    if (m->tok && m->tok->eos_id()) m->eos.push_back(static_cast<int32_t>(*m->tok->eos_id()));

    const ::tandem::DeviceKind kind = to_internal(options.device);
    m->device = ::tandem::device_create(
        kind, kind == ::tandem::DeviceKind::cuda ? env.launch.local_rank : 0);
    ::tandem::DecoderOptions o;
    o.batch = options.batch;
    o.max_seq = m->options.max_seq;
    o.mem_limit = options.mem_limit_bytes;
    o.attention = env.attention;
    // Checked before any weight is read.
    ::tandem::decoder_check_fits(c, *m->device, o);
    m->decoder =
        std::make_unique<::tandem::Decoder>(*m->layout, *m->device, m->source->load_params(), o);
    return Model(std::move(m));
  });
}

const ModelInfo& Model::info() const {
  return impl_->info;
}

const LoadOptions& Model::options() const {
  return impl_->options;
}

std::string Model::describe() const {
  return impl_->source->describe();
}

const std::optional<Tokenizer>& Model::tokenizer() const {
  return impl_->public_tok;
}

std::vector<uint32_t> Model::eos_ids() const {
  return {impl_->eos.begin(), impl_->eos.end()};
}

namespace {

std::vector<std::vector<int32_t>> to_i32(const std::vector<std::vector<uint32_t>>& prompts,
                                         int vocab) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    TD_CHECK(!p.empty(), "prompt {} is empty", out.size());
    for (uint32_t id : p)
      TD_CHECK(id < static_cast<uint32_t>(vocab),
               "token id {} of prompt {} is outside the vocabulary of {}", id, out.size(), vocab);
    out.emplace_back(p.begin(), p.end());
  }
  return out;
}

}  // namespace

Generation Model::generate(const std::vector<std::vector<uint32_t>>& prompts,
                           const GenerateOptions& options) {
  return translate_errors([&] {
    Impl& m = *impl_;
    const ::tandem::ModelConfig& c = m.layout->config();
    TD_CHECK(std::isfinite(options.temperature) && options.temperature >= 0,
             "temperature must be a finite number >= 0, got {}", options.temperature);
    TD_CHECK(options.top_k >= 0, "top_k must not be negative, got {}", options.top_k);
    TD_CHECK(options.top_p > 0 && options.top_p <= 1, "top_p must be in (0, 1], got {}",
             options.top_p);
    TD_CHECK(options.max_new_tokens > 0, "max_new_tokens must be positive, got {}",
             options.max_new_tokens);
    TD_CHECK(!prompts.empty(), "no prompt given");
    TD_CHECK(static_cast<int>(prompts.size()) <= m.options.batch,
             "{} prompts for a model loaded with batch {}: load it with a larger batch",
             prompts.size(), m.options.batch);
    TD_CHECK(options.stop.empty() || m.tok,
             "a stop text needs the model's tokenizer, and '{}' holds none", m.source->dir());
    const std::vector<std::vector<int32_t>> ids = to_i32(prompts, c.vocab);
    size_t longest = 0;
    for (const auto& p : ids) longest = std::max(longest, p.size());
    const int limit = m.options.max_seq;
    TD_CHECK(static_cast<int64_t>(longest) < limit,
             "the prompt has {} tokens, leaving no room for a new one within max_seq {}", longest,
             limit);

    const std::vector<int32_t> eos = options.ignore_eos ? std::vector<int32_t>{} : m.eos;
    std::optional<::tandem::SequenceText> text;
    if (m.tok) text.emplace(*m.tok, ids, options.stop, eos);
    ::tandem::GenerateRequest req;
    req.prompts = ids;
    req.tokens = std::min(options.max_new_tokens, limit - static_cast<int>(longest));
    req.sampling.temperature = options.temperature;
    req.sampling.top_k = options.top_k;
    req.sampling.top_p = options.top_p;
    req.sampling.seed = options.seed;
    req.eos = eos;
    req.ignore_eos = options.ignore_eos;
    req.on_token = [&](int s, int32_t t) {
      bool keep = text ? text->add(s, t) : true;
      if (options.on_token) keep = options.on_token(s, static_cast<uint32_t>(t)) && keep;
      return keep;
    };
    const ::tandem::GenerateResult r = m.decoder->generate(req);
    Generation g;
    for (size_t s = 0; s < r.ids.size(); ++s) {
      g.ids.emplace_back(r.ids[s].begin(), r.ids[s].end());
      if (m.tok) g.text.push_back(m.tok->decode(g.ids.back(), true));
    }
    g.finish = r.finish;
    g.prompt_tokens = r.prompt_tokens;
    g.time_to_first_token_ms = r.time_to_first_token_ms;
    g.prefill_tokens_per_s = r.prefill_tokens_per_s();
    g.decode_tokens_per_s = r.decode_tokens_per_s();
    g.peak_mem_bytes = m.decoder->memory().total();
    return g;
  });
}

std::vector<float> Model::logits(const std::vector<uint32_t>& ids) {
  return translate_errors([&] {
    Impl& m = *impl_;
    const ::tandem::ModelConfig& c = m.layout->config();
    TD_CHECK(!ids.empty(), "logits of no ids");
    TD_CHECK(static_cast<int64_t>(ids.size()) < m.options.max_seq,
             "the logits of {} ids need max_seq of at least {}, and the model was loaded with {}",
             ids.size(), ids.size() + 1, m.options.max_seq);
    const std::vector<std::vector<int32_t>> all = to_i32({ids}, c.vocab);
    ::tandem::GenerateRequest req;
    req.prompts = {{all[0][0]}};
    req.forced = {std::vector<int32_t>(all[0].begin() + 1, all[0].end())};
    req.tokens = static_cast<int>(ids.size());
    req.sampling.temperature = 0;
    req.ignore_eos = true;
    const size_t V = static_cast<size_t>(c.vocab);
    std::vector<float> out;
    out.reserve(ids.size() * V);
    // Row 0 of each step's logits is the sequence's: position 0 after the prefill, then
    // position i after the step that read ids[i].
    req.on_token = [&](int, int32_t) {
      const std::vector<float> l = m.decoder->last_logits();
      out.insert(out.end(), l.begin(), l.begin() + static_cast<std::ptrdiff_t>(V));
      return true;
    };
    m.decoder->generate(req);
    TD_CHECK(out.size() == ids.size() * V, "internal: {} logits for {} positions", out.size(),
             ids.size());
    return out;
  });
}

std::vector<ParameterView> Model::parameters() {
  return translate_errors([&] {
    Impl& m = *impl_;
    const bool host = m.device->kind() == ::tandem::DeviceKind::cpu;
    const int cb = m.decoder->param_bytes();
    const int units = m.layout->num_units();
    if (!host) {  // a host copy of every unit, as fp32
      m.host_copies.assign(static_cast<size_t>(units), {});
      for (int u = 0; u < units; ++u) {
        const size_t n = static_cast<size_t>(m.layout->unit(u).numel);
        std::vector<float>& dst = m.host_copies[static_cast<size_t>(u)];
        dst.resize(n);
        const void* src = m.decoder->unit_params(u);
        if (cb == 4) {
          m.device->copy_to_host(dst.data(), src, n * 4);
        } else {
          std::vector<uint16_t> half(n);
          m.device->copy_to_host(half.data(), src, n * 2);
          for (size_t i = 0; i < n; ++i) dst[i] = ::tandem::bf16_to_f32(half[i]);
        }
      }
    } else {
      TD_CHECK(cb == 4, "internal: a CPU model holds {}-byte parameters", cb);
    }
    std::vector<ParameterView> out;
    for (const ::tandem::HfTensorView& v :
         ::tandem::hf_tensor_views(*m.layout, m.source->hf_naming())) {
      ParameterView p;
      p.name = v.name;
      float* base = host ? static_cast<float*>(m.decoder->unit_params(v.unit))
                         : m.host_copies[static_cast<size_t>(v.unit)].data();
      p.data = base + v.offset;
      p.shape = v.shape;
      p.strides = v.strides;
      p.writable = host;
      out.push_back(std::move(p));
    }
    return out;
  });
}

}  // namespace tandem::api
