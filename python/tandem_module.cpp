// tandem._tandem: the library API (include/tandem/) for Python. The package's __init__.py
// wraps it in the documented classes (TrainConfig, Trainer, Model); what is here converts
// values, releases the GIL around every long call, turns tandem::Error into tandem.Error and
// lets Ctrl-C stop work at a step or token boundary.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>
#include <tandem/tandem.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

py::dict metrics_dict(const tandem::StepMetrics& m) {
  py::dict d;
  d["step"] = m.step;
  d["loss"] = m.loss;
  d["lr"] = m.lr;
  d["grad_norm"] = m.grad_norm;
  d["tokens_per_s"] = m.tokens_per_s;
  d["step_ms"] = m.step_ms;
  d["compute_ms"] = m.compute_ms;
  d["comm_ms"] = m.comm_ms;
  d["exposed_comm_ms"] = m.exposed_comm_ms;
  d["peak_mem_bytes"] = m.peak_mem_bytes;
  d["skipped"] = m.skipped;
  return d;
}

py::dict model_info_dict(const tandem::ModelInfo& i) {
  py::dict d;
  d["name"] = i.name;
  d["family"] = std::string(tandem::to_string(i.family));
  d["vocab"] = i.vocab;
  d["vocab_padded"] = i.vocab_padded;
  d["context"] = i.context;
  d["d_model"] = i.d_model;
  d["n_layer"] = i.n_layer;
  d["n_head"] = i.n_head;
  d["n_kv_head"] = i.n_kv_head;
  d["d_ff"] = i.d_ff;
  d["num_params"] = i.num_params;
  d["checkpoint_step"] = i.checkpoint_step;
  return d;
}

py::dict generation_dict(const tandem::Generation& g) {
  py::dict d;
  d["ids"] = g.ids;
  d["text"] = g.text;
  d["finish"] = g.finish;
  d["prompt_tokens"] = g.prompt_tokens;
  d["time_to_first_token_ms"] = g.time_to_first_token_ms;
  d["prefill_tokens_per_s"] = g.prefill_tokens_per_s;
  d["decode_tokens_per_s"] = g.decode_tokens_per_s;
  d["peak_mem_bytes"] = g.peak_mem_bytes;
  return d;
}

tandem::Device device_of(const std::string& name) {
  if (name == "cpu") return tandem::Device::cpu;
  if (name == "cuda") return tandem::Device::cuda;
  throw tandem::Error("device must be cpu or cuda, got '" + name + "'", "tandem.load", 0);
}

tandem::GenerateOptions generate_options(int max_new_tokens, float temperature, int top_k,
                                         float top_p, uint64_t seed, std::string stop,
                                         bool ignore_eos) {
  tandem::GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  o.stop = std::move(stop);
  o.ignore_eos = ignore_eos;
  return o;
}

// A Model shared by the Python object and the streams it started, so a stream that outlives
// its model's last reference still finds it.
struct PyModel {
  std::shared_ptr<tandem::Model> model;
  std::shared_ptr<std::mutex> busy = std::make_shared<std::mutex>();
};

// A generation running on its own thread, handing its tokens to the Python iterator.
class TokenStream {
 public:
  TokenStream(PyModel m, std::vector<std::vector<uint32_t>> prompts, tandem::GenerateOptions o)
      : model_(std::move(m)), lock_(*model_.busy, std::try_to_lock) {
    if (!lock_.owns_lock())
      throw tandem::Error("the model is busy with another generation", "Model.generate", 0);
    o.on_token = [this](int s, uint32_t t) {
      std::lock_guard<std::mutex> g(mu_);
      queue_.emplace_back(s, t);
      cv_.notify_all();
      return !cancel_;
    };
    worker_ = std::thread([this, prompts = std::move(prompts), o = std::move(o)] {
      try {
        tandem::Generation g = model_.model->generate(prompts, o);
        std::lock_guard<std::mutex> lk(mu_);
        result_ = std::move(g);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      cv_.notify_all();
    });
  }
  ~TokenStream() { stop(); }

  // The next (sequence, token), or nothing once the generation ended; rethrows its error.
  // Waits without the GIL; Ctrl-C while waiting ends the generation and raises.
  std::optional<std::pair<int, uint32_t>> next() {
    for (;;) {
      {
        py::gil_scoped_release release;
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return !queue_.empty() || done_; });
        if (!queue_.empty()) {
          auto item = queue_.front();
          queue_.pop_front();
          return item;
        }
        if (done_) break;
      }
      if (PyErr_CheckSignals() != 0) {
        stop();
        throw py::error_already_set();
      }
    }
    join();
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }

  std::optional<tandem::Generation> result() {
    std::lock_guard<std::mutex> lk(mu_);
    return result_;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      cancel_ = true;
    }
    py::gil_scoped_release release;
    join();
  }

 private:
  void join() {
    if (worker_.joinable()) worker_.join();
    if (lock_.owns_lock()) lock_.unlock();
  }

  PyModel model_;
  std::unique_lock<std::mutex> lock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, uint32_t>> queue_;
  bool done_ = false, cancel_ = false;
  std::optional<tandem::Generation> result_;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace

PYBIND11_MODULE(_tandem, m) {
  m.doc() = "tandem's library API; use the tandem package, which documents it.";

  static py::exception<tandem::Error> error_type(m, "Error");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tandem::Error& e) {
      py::object type = py::reinterpret_borrow<py::object>(error_type.ptr());
      py::object err = type(e.message());
      err.attr("message") = e.message();
      err.attr("call") = e.call();
      err.attr("rank") = e.rank();
      PyErr_SetObject(error_type.ptr(), err.ptr());
    }
  });

  // ---- configs and the planner
  m.def("train_config_normalize", [](const std::string& json) {
    return tandem::train_config_to_json(tandem::train_config_from_json(json));
  });
  m.def("model_presets", &tandem::model_presets);
  m.def("hardware_presets", &tandem::hardware_presets);
  m.def("load_model_info",
        [](const std::string& name) { return model_info_dict(tandem::load_model_info(name)); });
  m.def(
      "plan",
      [](const std::string& model, int ranks, int batch, int seq, int micro_steps, int max_gathered,
         int shard_group, std::optional<std::string> strategy, const std::string& hardware,
         std::optional<std::string> compute_probe, std::optional<std::string> links_probe,
         std::optional<double> tflops, std::optional<double> hbm_GBps,
         std::optional<double> mem_GiB, std::optional<double> link_GBps,
         std::optional<double> link_latency_us, const std::string& dtype) {
        tandem::PlanRequest r;
        r.model = model;
        r.ranks = ranks;
        r.batch = batch;
        r.seq = seq;
        r.micro_steps = micro_steps;
        r.max_gathered = max_gathered;
        r.shard_group = shard_group;
        if (strategy) {
          const std::string& s = *strategy;
          if (s == "full")
            r.strategy = tandem::Strategy::full;
          else if (s == "grad-op" || s == "grad_op")
            r.strategy = tandem::Strategy::grad_op;
          else if (s == "none")
            r.strategy = tandem::Strategy::none;
          else if (s == "hybrid")
            r.strategy = tandem::Strategy::hybrid;
          else
            throw tandem::Error("strategy must be full, grad-op, none or hybrid, got '" + s + "'",
                                "tandem.plan", 0);
        }
        r.hardware = hardware;
        if (compute_probe) r.compute_probe = *compute_probe;
        if (links_probe) r.links_probe = *links_probe;
        r.tflops = tflops;
        r.hbm_GBps = hbm_GBps;
        r.mem_GiB = mem_GiB;
        r.link_GBps = link_GBps;
        r.link_latency_us = link_latency_us;
        r.dtype = dtype;
        tandem::PlanResult p;
        {
          py::gil_scoped_release release;
          p = tandem::plan(r);
        }
        py::list strategies;
        for (const tandem::StrategyPlan& s : p.strategies) {
          py::dict d;
          d["strategy"] = std::string(tandem::to_string(s.strategy));
          d["applicable"] = s.applicable;
          d["fits"] = s.fits;
          d["peak_mem_bytes"] = s.peak_mem_bytes;
          d["step_ms"] = s.step_ms;
          d["min_step_ms"] = s.min_step_ms;
          d["tokens_per_s"] = s.tokens_per_s;
          d["compute_ms"] = s.compute_ms;
          d["comm_ms"] = s.comm_ms;
          d["exposed_comm_ms"] = s.exposed_comm_ms;
          d["link_ms"] = s.link_ms;
          d["gather_bytes"] = s.gather_bytes;
          d["reduce_bytes"] = s.reduce_bytes;
          d["all_reduce_bytes"] = s.all_reduce_bytes;
          d["bottleneck"] = s.bottleneck;
          strategies.append(d);
        }
        py::dict d;
        d["hardware"] = p.hardware;
        d["strategies"] = strategies;
        d["recommended"] =
            p.best() ? py::object(py::str(std::string(tandem::to_string(p.best()->strategy))))
                     : py::object(py::none());
        d["why"] = p.why;
        d["overlap"] = p.overlap;
        d["notes"] = p.notes;
        d["report"] = p.report;
        return d;
      },
      py::arg("model"), py::arg("ranks"), py::arg("batch"), py::arg("seq"), py::arg("micro_steps"),
      py::arg("max_gathered"), py::arg("shard_group"), py::arg("strategy"), py::arg("hardware"),
      py::arg("compute_probe"), py::arg("links_probe"), py::arg("tflops"), py::arg("hbm_GBps"),
      py::arg("mem_GiB"), py::arg("link_GBps"), py::arg("link_latency_us"), py::arg("dtype"));

  // ---- data
  m.def(
      "prepare_text_files",
      [](const std::vector<std::filesystem::path>& texts, const std::filesystem::path& out,
         std::optional<tandem::Tokenizer> tokenizer, int threads) {
        tandem::PrepareReport r;
        {
          py::gil_scoped_release release;
          r = tokenizer ? tandem::prepare_text_files(texts, out, *tokenizer, threads)
                        : tandem::prepare_text_files(texts, out);
        }
        py::dict d;
        d["files"] = r.files;
        d["bytes"] = r.bytes;
        d["tokens"] = r.tokens;
        return d;
      },
      py::arg("texts"), py::arg("out"), py::arg("tokenizer") = py::none(), py::arg("threads") = 0);
  m.def(
      "write_token_file",
      [](const std::filesystem::path& out, const std::vector<uint32_t>& tokens) {
        tandem::write_token_file(out, tokens);
      },
      py::arg("out"), py::arg("tokens"));

  // ---- tokenizers
  py::class_<tandem::Tokenizer>(m, "Tokenizer")
      .def_static("from_file", &tandem::Tokenizer::from_file, py::arg("path"),
                  "Loads a tokenizer.json, tokenizer.model, vocab.json (merges.txt beside it) "
                  "or the one a model directory holds.")
      .def_static("bytes", &tandem::Tokenizer::bytes, "The byte tokenizer: token i is byte i.")
      .def(
          "encode",
          [](const tandem::Tokenizer& t, const std::string& text, bool add_special_tokens) {
            py::gil_scoped_release release;
            return t.encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens") = false,
          "Token ids of text; add_special_tokens adds what the tokenizer adds around a text "
          "(Llama's BOS).")
      .def(
          "decode",
          [](const tandem::Tokenizer& t, const std::vector<uint32_t>& ids,
             bool skip_special_tokens) {
            std::string s = t.decode(ids, skip_special_tokens);
            return py::str(
                PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
          },
          py::arg("ids"), py::arg("skip_special_tokens") = false,
          "Text of ids (bytes that are not UTF-8 become U+FFFD).")
      .def_property_readonly("vocab_size", &tandem::Tokenizer::vocab_size)
      .def_property_readonly("bos_id", &tandem::Tokenizer::bos_id)
      .def_property_readonly("eos_id", &tandem::Tokenizer::eos_id)
      .def_property_readonly("kind", &tandem::Tokenizer::kind,
                             "'byte', 'tokenizer.json BPE', 'GPT-2 BPE' or 'SentencePiece'")
      .def("token_to_id", &tandem::Tokenizer::token_to_id, py::arg("token"))
      .def("id_to_token", &tandem::Tokenizer::id_to_token, py::arg("id"))
      .def("__repr__", [](const tandem::Tokenizer& t) {
        return "<tandem.Tokenizer " + t.kind() + ", vocabulary " + std::to_string(t.vocab_size()) +
               ">";
      });

  // ---- training
  py::class_<tandem::Trainer>(m, "_Trainer")
      .def(py::init([](const std::string& json) {
             const tandem::TrainConfig c = tandem::train_config_from_json(json);
             py::gil_scoped_release release;
             return std::make_unique<tandem::Trainer>(c);
           }),
           py::arg("config_json"))
      .def_static(
          "resume",
          [](const std::string& dir, const std::string& overrides) {
            py::gil_scoped_release release;
            return std::make_unique<tandem::Trainer>(tandem::Trainer::resume(dir, overrides));
          },
          py::arg("dir"), py::arg("overrides_json"))
      .def("step",
           [](tandem::Trainer& t) {
             tandem::StepMetrics s;
             {
               py::gil_scoped_release release;
               s = t.step();
             }
             return metrics_dict(s);
           })
      .def(
          "run",
          [](tandem::Trainer& t, int64_t steps, std::optional<py::function> callback) {
            tandem::StepCallback on_step;
            if (callback) {
              on_step = [&](const tandem::StepMetrics& s) {
                py::gil_scoped_acquire acquire;
                (*callback)(metrics_dict(s));
              };
            }
            tandem::StepMetrics s;
            {
              py::gil_scoped_release release;
              s = t.run(on_step, steps);
            }
            return metrics_dict(s);
          },
          py::arg("steps"), py::arg("callback"))
      .def("interrupted", &tandem::Trainer::interrupted)
      .def(
          "save",
          [](tandem::Trainer& t, const std::string& dir) {
            py::gil_scoped_release release;
            t.save(dir);
          },
          py::arg("dir"))
      .def_property_readonly("steps_done", &tandem::Trainer::steps_done)
      .def_property_readonly("rank", &tandem::Trainer::rank)
      .def_property_readonly("world_size", &tandem::Trainer::world_size)
      .def_property_readonly(
          "config_json",
          [](const tandem::Trainer& t) { return tandem::train_config_to_json(t.config()); })
      .def_property_readonly("model",
                             [](const tandem::Trainer& t) { return model_info_dict(t.model()); });

  m.def("finalize", &tandem::finalize,
        "Ends this rank's part of a multi-rank job (MPI); the package calls it at exit.");

  // ---- inference
  py::class_<TokenStream>(m, "_TokenStream")
      .def("next", &TokenStream::next)
      .def("result",
           [](TokenStream& s) -> py::object {
             auto r = s.result();
             if (!r) return py::none();
             return generation_dict(*r);
           })
      .def("close", &TokenStream::stop);

  py::class_<PyModel>(m, "_Model")
      .def(py::init([](const std::string& dir, const std::string& device, int batch, int max_seq,
                       uint64_t mem_limit) {
             tandem::LoadOptions o;
             o.device = device_of(device);
             o.batch = batch;
             o.max_seq = max_seq;
             o.mem_limit_bytes = mem_limit;
             py::gil_scoped_release release;
             PyModel p;
             p.model = std::make_shared<tandem::Model>(tandem::Model::load(dir, o));
             return p;
           }),
           py::arg("dir"), py::arg("device"), py::arg("batch"), py::arg("max_seq"),
           py::arg("mem_limit"))
      .def_property_readonly("info",
                             [](const PyModel& p) { return model_info_dict(p.model->info()); })
      .def_property_readonly("max_seq", [](const PyModel& p) { return p.model->options().max_seq; })
      .def_property_readonly("batch", [](const PyModel& p) { return p.model->options().batch; })
      .def_property_readonly("describe", [](const PyModel& p) { return p.model->describe(); })
      .def_property_readonly("tokenizer", [](const PyModel& p) { return p.model->tokenizer(); })
      .def_property_readonly("eos_ids", [](const PyModel& p) { return p.model->eos_ids(); })
      .def(
          "generate",
          [](PyModel& p, const std::vector<std::vector<uint32_t>>& prompts, int max_new_tokens,
             float temperature, int top_k, float top_p, uint64_t seed, std::string stop,
             bool ignore_eos) {
            tandem::GenerateOptions o = generate_options(max_new_tokens, temperature, top_k, top_p,
                                                         seed, std::move(stop), ignore_eos);
            std::optional<py::error_already_set> interrupted;
            // Ctrl-C ends every sequence at its next token; the interrupt is raised after.
            o.on_token = [&](int, uint32_t) {
              if (interrupted) return false;
              py::gil_scoped_acquire acquire;
              if (PyErr_CheckSignals() != 0) {
                interrupted.emplace();
                return false;
              }
              return true;
            };
            std::unique_lock<std::mutex> lock(*p.busy, std::try_to_lock);
            if (!lock.owns_lock())
              throw tandem::Error("the model is busy with another generation", "Model.generate", 0);
            tandem::Generation g;
            {
              py::gil_scoped_release release;
              g = p.model->generate(prompts, o);
            }
            if (interrupted) throw *interrupted;
            return generation_dict(g);
          },
          py::arg("prompts"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"),
          py::arg("top_p"), py::arg("seed"), py::arg("stop"), py::arg("ignore_eos"))
      .def(
          "stream",
          [](PyModel& p, std::vector<std::vector<uint32_t>> prompts, int max_new_tokens,
             float temperature, int top_k, float top_p, uint64_t seed, std::string stop,
             bool ignore_eos) {
            return std::make_unique<TokenStream>(
                p, std::move(prompts),
                generate_options(max_new_tokens, temperature, top_k, top_p, seed, std::move(stop),
                                 ignore_eos));
          },
          py::arg("prompts"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"),
          py::arg("top_p"), py::arg("seed"), py::arg("stop"), py::arg("ignore_eos"))
      .def(
          "logits",
          [](PyModel& p, const std::vector<uint32_t>& ids) {
            std::unique_lock<std::mutex> lock(*p.busy, std::try_to_lock);
            if (!lock.owns_lock())
              throw tandem::Error("the model is busy with another generation", "Model.logits", 0);
            auto out = std::make_unique<std::vector<float>>();
            {
              py::gil_scoped_release release;
              *out = p.model->logits(ids);
            }
            const auto rows = static_cast<py::ssize_t>(ids.size());
            const auto cols =
                static_cast<py::ssize_t>(out->size()) / std::max<py::ssize_t>(rows, 1);
            float* data = out->data();
            py::capsule owner(out.release(),
                              [](void* v) { delete static_cast<std::vector<float>*>(v); });
            return py::array_t<float>({rows, cols}, data, owner);
          },
          py::arg("ids"))
      .def("parameters", [](py::object self) {
        PyModel& p = self.cast<PyModel&>();
        py::dict out;
        for (const tandem::ParameterView& v : p.model->parameters()) {
          std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end()), strides;
          for (int64_t s : v.strides) strides.push_back(static_cast<py::ssize_t>(s * 4));
          // The array keeps the Python model, and so the memory it views, alive.
          py::array_t<float> a(shape, strides, v.data, self);
          if (!v.writable) {  // a GPU model's host copy, reused by the next call: a copy of it
            a = py::array_t<float>(a.attr("copy")());
            a.attr("setflags")(py::arg("write") = false);
          }
          out[py::str(v.name)] = a;
        }
        return out;
      });
}
