// Hardware presets, the probe files' schema and the least-squares fit of the link
// lines. The presets' figures and where they come from are listed in docs/planner.md.
#include "plan/hardware.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "plan/kernel_rates.h"

namespace tandem {

namespace {

LinkModel link(double GBps, double latency_us) {
  LinkModel l;
  l.GBps = GBps;
  l.latency_us = latency_us;
  return l;
}

Hardware gpu_preset(const char* name, double tflops, double hbm, double mem, LinkModel gather,
                    LinkModel all_reduce) {
  Hardware h;
  h.name = name;
  h.source = fmt::format("preset {}", name);
  h.gpu = true;
  h.tflops = tflops;
  h.hbm_GBps = hbm;
  h.mem_GiB = mem;
  h.all_gather = gather;
  h.reduce_scatter = gather;
  h.all_reduce = all_reduce;
  h.param_bytes = 2;
  h.grad_bytes = 4;
  h.activation_bytes = 2;
  return h;
}

void set_cpu_numerics(Hardware& h, bool cpu) {
  h.gpu = !cpu;
  h.param_bytes = cpu ? 4 : 2;
  h.grad_bytes = 4;
  h.activation_bytes = cpu ? 4 : 2;
}

std::vector<Hardware> all_presets() {
  // NVLink 4 on 8 GPUs: ~370 GB/s bus bandwidth for all-gather and reduce-scatter, ~475
  // for all-reduce (NCCL bus bandwidth measured on 8 H200s); NVLink 3 (A100): ~230 for all three.
  // Latency: 20 us per collective as a decode loop sees it (launch and synchronisation
  // included), which reproduces gpt-fast's tensor-parallel scaling on A100 (docs/planner.md).
  const LinkModel nvlink4 = link(370, 20), nvlink4_ar = link(475, 20), nvlink3 = link(230, 20);
  const LinkModel pcie4 = link(25, 30);
  std::vector<Hardware> p = {
      gpu_preset("h100-sxm", 720, 2900, 79.6, nvlink4, nvlink4_ar),
      gpu_preset("h200-sxm", 758, 4170, 140.4, nvlink4, nvlink4_ar),
      gpu_preset("a100-80g", 270, 1750, 80.0, nvlink3, nvlink3),
      // A100-class GPUs with no NVLink, PCIe 4.0 x16 between: where FSDP decoding of Llama-2-7B
      // fell from 33.4 tokens/s on one GPU to 2.5 on two (docs/planner.md).
      gpu_preset("pcie-gen4", 270, 1750, 80.0, pcie4, pcie4),
  };
  // A plain two-core machine with MPI over shared memory: modest figures, meant to be
  // replaced by `tandem probe compute --save` and `tandem probe links --save` files.
  Hardware cpu = gpu_preset("cpu-local", 0.1, 10, 8.0, link(5, 10), link(5, 10));
  set_cpu_numerics(cpu, true);
  p.push_back(cpu);
  return p;
}

double number(const nlohmann::json& j, const char* key, const char* what) {
  TD_CHECK(j.contains(key), "{}: missing key '{}'", what, key);
  TD_CHECK(j.at(key).is_number(), "{}: key '{}' must be a number, got {}", what, key,
           j.at(key).dump());
  const double v = j.at(key).get<double>();
  TD_CHECK(std::isfinite(v) && v > 0, "{}: key '{}' must be positive, got {}", what, key, v);
  return v;
}

// The (bus bytes, time) points of one collective's sweep in a links file.
std::vector<std::pair<double, double>> sweep(const nlohmann::json& entries, double bus_factor,
                                             const std::string& what) {
  TD_CHECK(entries.is_array(), "{} must be a list of measurements", what);
  std::vector<std::pair<double, double>> pts;
  for (const nlohmann::json& e : entries) {
    TD_CHECK(e.is_object(), "{}: each measurement must be an object, got {}", what, e.dump());
    const double bytes = number(e, "bytes", what.c_str());
    TD_CHECK(!e.contains("wrong") || e.at("wrong") == 0,
             "{}: the measurement at {} bytes had {} wrong values; fix the links before planning "
             "with them",
             what, bytes, e.at("wrong").dump());
    const double bus = bytes * bus_factor;
    // time_us is the measurement; a file with only busbw_GBps loses the latency.
    const double t = e.contains("time_us") ? number(e, "time_us", what.c_str())
                                           : bus / (number(e, "busbw_GBps", what.c_str()) * 1e3);
    pts.push_back({bus, t});
  }
  TD_CHECK(!pts.empty(), "{} has no measurements", what);
  return pts;
}

}  // namespace

double Hardware::all_gather_ms(double bytes, int group) const {
  return group <= 1 ? 0 : all_gather.ms(bytes * (group - 1) / group);
}

double Hardware::reduce_scatter_ms(double bytes, int group) const {
  return group <= 1 ? 0 : reduce_scatter.ms(bytes * (group - 1) / group);
}

double Hardware::all_reduce_ms(double bytes, int group) const {
  return group <= 1 ? 0 : all_reduce.ms(2 * bytes * (group - 1) / group);
}

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const Hardware& h : all_presets()) names.push_back(h.name);
  return names;
}

Hardware hardware_preset(const std::string& name) {
  for (const Hardware& h : all_presets())
    if (h.name == name) return h;
  std::string known;
  for (const auto& n : hardware_preset_names()) known += (known.empty() ? "" : ", ") + n;
  TD_THROW("unknown hardware preset '{}' (known: {})", name, known);
}

nlohmann::json hardware_read_file(const std::string& path, const char* what) {
  return json_read_file(path, what);
}

Hardware hardware_resolve(const std::string& preset, const std::string& compute_file,
                          const std::string& links_file) {
  Hardware hw = hardware_preset(preset);
  if (!compute_file.empty()) {
    hardware_apply_compute(hw, hardware_read_file(compute_file, "compute probe file"));
    hw.source += " + compute probe " + compute_file;
    if (hw.kernels) hw.source += " (" + hardware_kernels_text(*hw.kernels) + ")";
  }
  if (!links_file.empty()) {
    hardware_apply_links(hw, hardware_read_file(links_file, "links probe file"));
    hw.source += " + links probe " + links_file;
  }
  return hw;
}

std::string hardware_preset_for_device(const std::string& device_name) {
  if (device_name == "cpu") return "cpu-local";
  // CUDA devices are named "cuda:<index> (<GPU model>)", e.g. "cuda:0 (NVIDIA H200)".
  static const std::pair<const char*, const char*> gpus[] = {
      {"H200", "h200-sxm"}, {"H100", "h100-sxm"}, {"A100", "a100-80g"}};
  for (const auto& [model, preset] : gpus)
    if (device_name.find(model) != std::string::npos) return preset;
  return "";
}

void hardware_apply_compute(Hardware& hw, const nlohmann::json& j) {
  const char* what = "compute probe file";
  TD_CHECK(j.is_object(), "{} must be a JSON object", what);
  TD_CHECK(j.contains("device") && j.at("device").is_string(),
           "{}: missing key 'device' (\"cpu\" or \"cuda\")", what);
  const std::string device = j.at("device").get<std::string>();
  TD_CHECK(device == "cpu" || device == "cuda", "{}: device '{}' (expected cpu or cuda)", what,
           device);
  set_cpu_numerics(hw, device == "cpu");
  // A device without a bf16 GEMM (tflops_bf16 null) computes in fp32.
  const bool bf16 = device == "cuda" && j.contains("tflops_bf16") && !j.at("tflops_bf16").is_null();
  hw.tflops = number(j, bf16 ? "tflops_bf16" : "tflops_f32", what);
  hw.hbm_GBps = number(j, "copy_GBps", what);
  hw.matvec_GBps = j.contains("matvec_GBps") ? number(j, "matvec_GBps", what) : 0;
  hw.head_matvec_GBps = j.contains("head_matvec_GBps") ? number(j, "head_matvec_GBps", what) : 0;
  if (j.contains("mem_GiB")) hw.mem_GiB = number(j, "mem_GiB", what);
  hw.kernels.reset();
  if (j.contains("kernels") && !j.at("kernels").is_null())
    hw.kernels =
        std::make_shared<const KernelRates>(kernel_rates_from_json(j.at("kernels"), device));
}

std::string hardware_kernels_text(const KernelRates& k) {
  return fmt::format("kernel tables: {} shapes{}, launch {:.3g} us", k.entries.size(),
                     k.model.empty()
                         ? std::string(" of the default grid")
                         : fmt::format(" of {} at batch {} x {}", k.model, k.batch, k.seq),
                     k.launch_us);
}

// [Link fit] Each collective's sweep is fitted to time = latency + bus_bytes / GBps by
// weighted least squares with weights 1 / time^2, i.e. minimising the relative error: an
// unweighted fit lets the largest sizes decide everything and can leave a negative
// latency, while the relative fit follows the small, latency-bound sizes as closely as
// the large, bandwidth-bound ones. A negative latency is clamped to zero (and the slope
// refitted through the origin).
LinkModel link_fit(const std::vector<std::pair<double, double>>& pts) {
  TD_CHECK(!pts.empty(), "a link fit needs at least one measurement");
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (const auto& [x, y] : pts) {
    TD_CHECK(x > 0 && y > 0, "a link measurement needs positive bytes and time");
    const double w = 1 / (y * y);
    s0 += w;
    s1 += w * x;
    s2 += w * x * x;
    t0 += w * y;
    t1 += w * x * y;
  }
  const double det = s0 * s2 - s1 * s1;
  double slope = 0, latency = 0;  // us per byte, us
  if (pts.size() >= 2 && det > 1e-12 * s0 * s2) {
    slope = (s0 * t1 - s1 * t0) / det;
    latency = (t0 - slope * s1) / s0;
  }
  if (slope <= 0 || latency < 0) {
    latency = 0;
    slope = t1 / s2;
  }
  LinkModel l;
  l.latency_us = latency;
  l.GBps = 1e-3 / slope;
  return l;
}

void hardware_apply_links(Hardware& hw, const nlohmann::json& j) {
  const char* what = "links probe file";
  TD_CHECK(j.is_object(), "{} must be a JSON object", what);
  const int n = json_get_int<int>(j, "ranks", what);
  TD_CHECK(n >= 2, "{}: key 'ranks' must be an integer of at least 2", what);
  const double one = static_cast<double>(n - 1) / n;
  struct Entry {
    const char* key;
    double factor;
    LinkModel* out;
    bool found = false;
  };
  Entry entries[] = {{"all_gather", one, &hw.all_gather},
                     {"reduce_scatter", one, &hw.reduce_scatter},
                     {"all_reduce", 2 * one, &hw.all_reduce}};
  for (Entry& e : entries) {
    if (!j.contains(e.key)) continue;
    *e.out = link_fit(sweep(j.at(e.key), e.factor, fmt::format("{}: '{}'", what, e.key)));
    e.found = true;
  }
  // A collective the probe skipped borrows the line of one it measured.
  const Entry* any = nullptr;
  for (const Entry& e : entries)
    if (e.found && any == nullptr) any = &e;
  TD_CHECK(any != nullptr, "{}: none of all_gather, reduce_scatter, all_reduce is present", what);
  if (!entries[0].found) hw.all_gather = entries[1].found ? hw.reduce_scatter : *any->out;
  if (!entries[1].found) hw.reduce_scatter = entries[0].found ? hw.all_gather : *any->out;
  if (!entries[2].found) hw.all_reduce = hw.reduce_scatter;
  hw.links_ranks = n;
}

void hardware_validate(const Hardware& hw) {
  auto positive = [&](double v, const char* what) {
    TD_CHECK(std::isfinite(v) && v > 0, "hardware: {} must be positive, got {}", what, v);
  };
  positive(hw.tflops, "--tflops");
  positive(hw.hbm_GBps, "--hbm-GBps");
  positive(hw.mem_GiB, "--mem-GiB");
  for (const LinkModel* l : {&hw.all_gather, &hw.reduce_scatter, &hw.all_reduce}) {
    positive(l->GBps, "--link-GBps");
    TD_CHECK(std::isfinite(l->latency_us) && l->latency_us >= 0,
             "hardware: --link-latency-us must not be negative, got {}", l->latency_us);
  }
}

nlohmann::json hardware_to_json(const Hardware& hw) {
  auto line = [](const LinkModel& l) {
    return nlohmann::json{{"GBps", l.GBps}, {"latency_us", l.latency_us}};
  };
  nlohmann::json j = {{"name", hw.name},
                      {"source", hw.source},
                      {"device", hw.gpu ? "cuda" : "cpu"},
                      {"tflops", hw.tflops},
                      {"hbm_GBps", hw.hbm_GBps},
                      {"mem_GiB", hw.mem_GiB},
                      {"links",
                       {{"all_gather", line(hw.all_gather)},
                        {"reduce_scatter", line(hw.reduce_scatter)},
                        {"all_reduce", line(hw.all_reduce)}}},
                      {"dtype", hardware_dtype(hw)},
                      {"param_bytes", hw.param_bytes},
                      {"grad_bytes", hw.grad_bytes},
                      {"activation_bytes", hw.activation_bytes}};
  if (hw.links_ranks > 0) j["links"]["measured_ranks"] = hw.links_ranks;
  if (hw.matvec_GBps > 0) j["matvec_GBps"] = hw.matvec_GBps;
  if (hw.head_matvec_GBps > 0) j["head_matvec_GBps"] = hw.head_matvec_GBps;
  if (hw.kernels)
    j["kernels"] = {{"shapes", hw.kernels->entries.size()},
                    {"launch_us", hw.kernels->launch_us},
                    {"model", hw.kernels->model.empty() ? nlohmann::json(nullptr)
                                                        : nlohmann::json(hw.kernels->model)},
                    {"batch", hw.kernels->batch},
                    {"seq", hw.kernels->seq}};
  return j;
}

void hardware_set_dtype(Hardware& hw, const std::string& dtype) {
  TD_CHECK(dtype == "auto" || dtype == "bf16" || dtype == "fp32",
           "--dtype must be auto, bf16 or fp32, got '{}'", dtype);
  if (dtype == "auto") return;
  const size_t bytes = dtype == "bf16" ? 2 : 4;
  hw.param_bytes = bytes;
  hw.activation_bytes = bytes;
  hw.grad_bytes = 4;
  hw.source += " + --dtype " + dtype;
}

std::string hardware_dtype(const Hardware& hw) {
  return hw.param_bytes == 2 ? "bf16" : "fp32";
}

std::string hardware_describe(const Hardware& hw) {
  auto line = [](const LinkModel& l) {
    return fmt::format("{:.4g} GB/s + {:.3g} us", l.GBps, l.latency_us);
  };
  return fmt::format(
      "{} ({}): {:.4g} TFLOP/s {}, {:.4g} GB/s memory, {:.4g} GiB per rank; links: "
      "all-gather {}, reduce-scatter {}, all-reduce {}",
      hw.name, hw.source, hw.tflops, hardware_dtype(hw), hw.hbm_GBps, hw.mem_GiB,
      line(hw.all_gather), line(hw.reduce_scatter), line(hw.all_reduce));
}

}  // namespace tandem
