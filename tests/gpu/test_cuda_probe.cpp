// The CUDA backend of `tandem probe` (src/plan/cuda/probe_backend_cuda.cu): its stream kinds are
// streams of the device with CUDA's flags and CUDA's ordering rules, its GEMMs, copy and
// delay compute what they should, and the three probes run on one GPU.
//
// The overlap probe must reproduce the failure of a training run on AMD GPUs whose
// communication never overlapped: a blocking communication stream waits for a GEMM on the
// legacy default stream, and every other pair of stream kinds overlaps.
// As the CPU tests do ([Probe test timing] in tests/unit/test_probe.cpp), both parts are
// padded with 40 ms on their stream (here a spin kernel of one thread, which leaves the SMs
// to the other stream), so the stream configuration alone decides the result: t_both is
// ~40 ms and overlap ~1 when the streams overlap, ~80 ms and ~0 when one waits for the
// other. Skips without a GPU. Without a launcher the world is NCCL's one-rank world; under
// mpirun (one GPU per rank) every rank runs the same tests, which are collective.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/environment.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "device/cuda/cuda_device.h"
#include "device/device.h"
#include "gpu/gpu_test_util.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/probe_backend.h"
#include "plan/probe_compute.h"
#include "plan/probe_links.h"
#include "plan/probe_overlap.h"
#include "plan/trace.h"

namespace tandem {
namespace {

constexpr double kPadMs = 40;

class CudaProbeTest : public ::testing::Test {
 protected:
  // One device, world and backend for the suite (creating a world is a collective).
  static void SetUpTestSuite() {
    if (gpu_test::gpu_count() == 0) return;
    try {
      device_ = device_create_cuda(gpu_test::local_gpu()).release();
      world_ =
          comm_world(*device_, CommOptions{300, environment_from_process().launch.mpi}).release();
      backend_ = probe_backend_create(*device_).release();
    } catch (const Error& e) {
      setup_error_ = e.describe();
    }
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
    delete world_;
    world_ = nullptr;
    delete device_;
    device_ = nullptr;
  }

  void SetUp() override {
    TD_SKIP_WITHOUT_GPU();
    ASSERT_NE(backend_, nullptr) << "creating the device, world or probe backend failed: "
                                 << setup_error_;
  }

  Device& dev() { return *device_; }
  ProbeBackend& backend() { return *backend_; }

  // Device memory from the host values.
  template <typename T>
  std::unique_ptr<ProbeBuffer> upload(const std::vector<T>& host) {
    auto buf = std::make_unique<ProbeBuffer>(dev(), host.size() * sizeof(T));
    dev().copy_to_device(buf->get(), host.data(), host.size() * sizeof(T));
    return buf;
  }
  template <typename T>
  std::vector<T> download(const ProbeBuffer& buf, size_t n) {
    std::vector<T> host(n);
    dev().copy_to_host(host.data(), buf.get(), n * sizeof(T));
    return host;
  }

  static Device* device_;
  static Communicator* world_;
  static ProbeBackend* backend_;
  static std::string setup_error_;
};

Device* CudaProbeTest::device_ = nullptr;
Communicator* CudaProbeTest::world_ = nullptr;
ProbeBackend* CudaProbeTest::backend_ = nullptr;
std::string CudaProbeTest::setup_error_;

unsigned stream_flags(Stream& s) {
  unsigned flags = 99;
  EXPECT_EQ(cudaStreamGetFlags(cuda_stream_of(s), &flags), cudaSuccess);
  return flags;
}

int stream_priority(Stream& s) {
  int priority = 99;
  EXPECT_EQ(cudaStreamGetPriority(cuda_stream_of(s), &priority), cudaSuccess);
  return priority;
}

// ---- the backend ----

TEST_F(CudaProbeTest, StreamKindsAreDeviceStreamsWithCudaFlags) {
  using K = StreamKind;
  EXPECT_EQ(backend().compute_stream_kinds(),
            (std::vector<K>{K::legacy_default, K::blocking, K::non_blocking}));
  EXPECT_EQ(backend().comm_stream_kinds(), (std::vector<K>{K::blocking, K::non_blocking}));
  EXPECT_EQ(overlap_configs(backend()).size(), 3u * 2u * 2u + 1u);

  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  auto legacy = backend().stream_create(K::legacy_default, "compute [legacy-default]", 0);
  auto blocking = backend().stream_create(K::blocking, "all-gather [blocking]", 1);
  auto non_blocking = backend().stream_create(K::non_blocking, "compute [non-blocking]", 0);
  EXPECT_EQ(legacy->name(), "compute [legacy-default]");
  EXPECT_EQ(blocking->name(), "all-gather [blocking]");
  EXPECT_EQ(cuda_stream_of(*legacy), cudaStreamLegacy);
  EXPECT_EQ(stream_flags(*blocking), static_cast<unsigned>(cudaStreamDefault));
  EXPECT_EQ(stream_priority(*blocking), greatest);
  EXPECT_EQ(stream_flags(*non_blocking), static_cast<unsigned>(cudaStreamNonBlocking));
  EXPECT_EQ(stream_priority(*non_blocking), least);
  EXPECT_THROW(backend().stream_create(K::dedicated, "x", 0), Error);
  EXPECT_THROW(backend().stream_create(K::shared, "x", 0), Error);

  // A handle to stream 0 neither creates nor destroys it: after the first handle is gone,
  // another one still works.
  legacy.reset();
  auto again = cuda_stream_legacy_default(dev(), "stream 0 again");
  auto e0 = dev().event_create(true), e1 = dev().event_create(true);
  dev().event_record(*e0, *again);
  backend().delay(*again, 5);
  dev().event_record(*e1, *again);
  dev().stream_sync(*again);
  EXPECT_GE(dev().event_elapsed_ms(*e0, *e1), 4.5);
}

// The rules the overlap probe's configurations rest on, observed: work on a blocking stream
// waits for earlier work of the legacy default stream; a non-blocking stream does not; and
// events order any two kinds.
TEST_F(CudaProbeTest, BlockingStreamsWaitForTheLegacyDefaultStream) {
  using K = StreamKind;
  auto legacy = backend().stream_create(K::legacy_default, "legacy", 0);
  auto blocking = backend().stream_create(K::blocking, "blocking", 1);
  auto non_blocking = backend().stream_create(K::non_blocking, "non-blocking", 1);
  auto start = dev().event_create(true), b = dev().event_create(true),
       nb = dev().event_create(true);
  dev().event_record(*start, *legacy);
  backend().delay(*legacy, 100);
  backend().delay(*blocking, 1);
  dev().event_record(*b, *blocking);
  backend().delay(*non_blocking, 1);
  dev().event_record(*nb, *non_blocking);
  dev().stream_sync(*blocking);
  dev().stream_sync(*non_blocking);
  dev().stream_sync(*legacy);
  EXPECT_GE(dev().event_elapsed_ms(*start, *b), 95.0);   // waited for stream 0's delay
  EXPECT_LT(dev().event_elapsed_ms(*start, *nb), 50.0);  // did not

  // An event orders a blocking producer and a non-blocking consumer: without the wait the
  // consumer would copy y before the delayed producer wrote it.
  const size_t n = 1 << 20;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000);
  auto xs = upload(x);
  auto ys = upload(std::vector<float>(n, -1.0f));
  auto zs = upload(std::vector<float>(n, -2.0f));
  auto produced = dev().event_create();
  backend().delay(*blocking, 100);
  backend().copy(*blocking, ys->get(), xs->get(), n * sizeof(float));
  dev().event_record(*produced, *blocking);
  dev().stream_wait(*non_blocking, *produced);
  backend().copy(*non_blocking, zs->get(), ys->get(), n * sizeof(float));
  dev().stream_sync(*non_blocking);
  EXPECT_EQ(download<float>(*zs, n), x);
  dev().stream_sync(*blocking);
}

// Small integers, so that every product and sum is exact: fp32 sums of up to 130 terms of
// |v| <= 4, and bf16 inputs in {-1, 0, 1} whose sums (|s| <= 130 < 256) bf16 holds exactly.
float a_value(int i, int k, int span) {
  return static_cast<float>((i * 7 + k * 3) % span - span / 2);
}
float b_value(int k, int j, int span) {
  return static_cast<float>((k * 5 + j * 2 + 1) % span - span / 2);
}

TEST_F(CudaProbeTest, GemmsComputeRowMajorProducts) {
  auto s = backend().stream_create(StreamKind::non_blocking, "gemm", 0);
  ASSERT_TRUE(backend().has_gemm_bf16());
  for (int n : {64, 130}) {
    for (bool bf16 : {false, true}) {
      const int span = bf16 ? 3 : 5;
      const size_t elems = static_cast<size_t>(n) * n;
      std::vector<float> a(elems), b(elems), want(elems, 0.0f);
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) {
          a[static_cast<size_t>(i) * n + k] = a_value(i, k, span);
          b[static_cast<size_t>(i) * n + k] = b_value(i, k, span);
        }
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k)
          for (int j = 0; j < n; ++j)
            want[static_cast<size_t>(i) * n + j] +=
                a[static_cast<size_t>(i) * n + k] * b[static_cast<size_t>(k) * n + j];
      std::vector<float> got(elems);
      if (bf16) {
        std::vector<uint16_t> a16(elems), b16(elems);
        for (size_t i = 0; i < elems; ++i) {
          a16[i] = bf16_from_f32(a[i]);
          b16[i] = bf16_from_f32(b[i]);
        }
        auto da = upload(a16), db = upload(b16);
        auto dc = upload(std::vector<uint16_t>(elems, 0));
        backend().gemm_bf16(*s, n, da->get(), db->get(), dc->get());
        dev().stream_sync(*s);
        const std::vector<uint16_t> c16 = download<uint16_t>(*dc, elems);
        for (size_t i = 0; i < elems; ++i) got[i] = bf16_to_f32(c16[i]);
      } else {
        auto da = upload(a), db = upload(b);
        auto dc = upload(std::vector<float>(elems, 0.0f));
        backend().gemm_f32(*s, n, da->f32(), db->f32(), dc->f32());
        dev().stream_sync(*s);
        got = download<float>(*dc, elems);
      }
      size_t wrong = 0;
      for (size_t i = 0; i < elems; ++i) wrong += got[i] != want[i];
      EXPECT_EQ(wrong, 0u) << (bf16 ? "bf16" : "fp32") << " n = " << n << ", e.g. c[0] = " << got[0]
                           << " instead of " << want[0];
    }
  }
  EXPECT_THROW(backend().gemm_f32(*s, 0, nullptr, nullptr, nullptr), Error);
}

// GEMMs on streams created anew (more than the backend's workspaces) stay right.
TEST_F(CudaProbeTest, GemmsOnManyStreams) {
  const int n = 96;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<float> a(elems), b(elems), want(elems, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      a[static_cast<size_t>(i) * n + k] = a_value(i, k, 5);
      b[static_cast<size_t>(i) * n + k] = b_value(i, k, 5);
    }
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j)
        want[static_cast<size_t>(i) * n + j] +=
            a[static_cast<size_t>(i) * n + k] * b[static_cast<size_t>(k) * n + j];
  auto da = upload(a), db = upload(b);
  std::vector<std::unique_ptr<ProbeBuffer>> outs;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 10; ++i) {
    outs.push_back(upload(std::vector<float>(elems, 0.0f)));
    const StreamKind kind = i % 3 == 0   ? StreamKind::legacy_default
                            : i % 3 == 1 ? StreamKind::blocking
                                         : StreamKind::non_blocking;
    streams.push_back(backend().stream_create(kind, "gemm " + std::to_string(i), 0));
    backend().gemm_f32(*streams.back(), n, da->f32(), db->f32(), outs.back()->f32());
  }
  for (auto& s : streams) dev().stream_sync(*s);
  for (const auto& out : outs) EXPECT_EQ(download<float>(*out, elems), want);
}

TEST_F(CudaProbeTest, CopyAndDelay) {
  auto s = backend().stream_create(StreamKind::non_blocking, "copy", 0);
  const size_t n = size_t{16} << 20;  // 64 MiB of floats
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 4099);
  auto src = upload(x);
  auto dst = upload(std::vector<float>(n, 0.0f));
  auto e0 = dev().event_create(true), e1 = dev().event_create(true);
  dev().event_record(*e0, *s);
  backend().delay(*s, 50);
  backend().copy(*s, dst->get(), src->get(), n * sizeof(float));
  dev().event_record(*e1, *s);
  dev().stream_sync(*s);
  EXPECT_EQ(download<float>(*dst, n), x);
  const double ms = dev().event_elapsed_ms(*e0, *e1);
  EXPECT_GE(ms, 49.5);
  EXPECT_LT(ms, 1000.0);
  backend().copy(*s, dst->get(), src->get(), 0);  // nothing to do
  backend().delay(*s, 0);
  dev().stream_sync(*s);
}

TEST_F(CudaProbeTest, MemoryAndTopology) {
  EXPECT_GT(backend().mem_GiB(), 1.0);
  EXPECT_GE(backend().max_gemm_n(), 8192);
  EXPECT_EQ(backend().default_links_max_bytes(), size_t{1} << 30);
  const nlohmann::json t = backend().local_topology();
  std::printf("local topology: %s\n", t.dump().c_str());
  EXPECT_FALSE(t.value("host", "").empty());
  EXPECT_EQ(t.value("device", ""), "cuda");
  EXPECT_FALSE(t.value("gpu", "").empty());
  EXPECT_EQ(t.value("gpu_index", -1), cuda_gpu_of(dev()));
  EXPECT_FALSE(t.value("pci_bus_id", "").empty());
  const int gpus = t.value("gpus_visible", 0);
  EXPECT_EQ(gpus, gpu_test::gpu_count());
  EXPECT_NEAR(t.value("mem_GiB", 0.0), backend().mem_GiB(), 1e-9);
  const std::string nvml = t.value("nvml", "");
  EXPECT_TRUE(nvml == "ok" || nvml == "unavailable") << nvml;
  if (nvml == "ok") {
    ASSERT_TRUE(t.contains("gpu_links"));
    EXPECT_EQ(t.at("gpu_links").size(), static_cast<size_t>(gpus * (gpus - 1) / 2));
    for (const auto& pair : t.at("gpu_links")) {
      const std::string link = pair.value("link", "");
      EXPECT_TRUE(link == "NVLink" || link == "PCIe" || link == "unknown") << pair.dump();
      EXPECT_FALSE(pair.value("label", "").empty()) << pair.dump();
    }
  } else {
    EXPECT_FALSE(t.value("nvml_error", "").empty());
  }
  const std::string caveat = backend().timing_caveat(1);
  std::printf("timing caveat: '%s'\n", caveat.c_str());
}

// ---- the overlap probe ----

using ConfigKey = std::tuple<StreamKind, StreamKind, StreamLifetime>;

ConfigKey key_of(const OverlapConfig& c) {
  return {c.compute, c.comm, c.lifetime};
}

// Every non-metadata event's (pid, tid) has a non-empty thread_name; returns the names.
std::set<std::string> named_tracks(const nlohmann::json& doc) {
  std::map<std::pair<int, int>, std::string> names;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      names[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name");
  std::set<std::string> used;
  size_t events = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    ++events;
    const auto key = std::make_pair(e.at("pid").get<int>(), e.at("tid").get<int>());
    EXPECT_TRUE(names.count(key) && !names[key].empty())
        << "event '" << e.value("name", "") << "' on unnamed track " << key.first << "/"
        << key.second;
    used.insert(names[key]);
  }
  EXPECT_GT(events, 0u);
  return used;
}

TEST_F(CudaProbeTest, OverlapReproducesTheFieldReport) {
  Trace trace(world_->rank(), "rank " + std::to_string(world_->rank()));
  OverlapOptions o;
  o.gemm_n = 64;
  o.bytes = 65536;
  o.warmup = 1;
  o.iters = 4;
  o.compute_pad_ms = kPadMs;
  o.comm_pad_ms = kPadMs;
  o.trace = &trace;
  const OverlapReport r = probe_overlap(backend(), *world_, o);
  const std::string text = overlap_format(r);
  std::printf("%s", text.c_str());

  // Every configuration: 3 compute kinds x 2 comm kinds x 2 lifetimes, then the control.
  std::set<ConfigKey> want;
  for (const auto& c : overlap_configs(backend())) want.insert(key_of(c));
  EXPECT_EQ(want.size(), 13u);
  std::set<ConfigKey> got;
  for (const auto& row : r.rows) got.insert(key_of(row.config));
  EXPECT_EQ(got, want);
  ASSERT_EQ(r.rows.size(), 13u);

  for (const auto& row : r.rows) {
    const bool serialised = row.config.compute == StreamKind::shared ||
                            (row.config.compute == StreamKind::legacy_default &&
                             row.config.comm == StreamKind::blocking);
    for (const OverlapMeasure* m : {&row.semantics, &row.sharing}) {
      const std::string what =
          row.config.label() + (m == &row.semantics ? ", stream semantics" : ", sharing");
      EXPECT_GE(m->t_compute_ms, kPadMs - 1) << what;
      EXPECT_GE(m->t_comm_ms, kPadMs - 1) << what;
      EXPECT_GT(m->t_both_ms, 0) << what;
      EXPECT_GE(m->overlap, 0.0) << what;
      EXPECT_LE(m->overlap, 1.0) << what;
      if (serialised) {
        // The serialised pair (and the control): stream 0's train waits for the blocking
        // stream's communication, issued first.
        EXPECT_LE(m->overlap, 0.3) << what << ": " << m->t_both_ms << " ms together";
        EXPECT_GE(m->t_both_ms, 2 * kPadMs - 5) << what;
        EXPECT_EQ(m->verdict, "no overlap") << what;
      } else {
        EXPECT_GE(m->overlap, 0.7) << what << ": " << m->t_both_ms << " ms together";
        EXPECT_EQ(m->verdict, "overlaps") << what;
      }
    }
    EXPECT_EQ(row.limited_by, serialised ? "streams" : "") << row.config.label();
  }

  EXPECT_NE(text.find("cuda streams: legacy-default is stream 0"), std::string::npos) << text;
  if (world_->size() == 1) {
    EXPECT_EQ(overlap_to_json(r).at("one_rank_copy"), true);
    EXPECT_EQ(r.comm, "copy to host");
    EXPECT_NE(text.find("a copy to pinned host memory on a copy engine"), std::string::npos)
        << text;
  }
  for (const char* line :
       {"legacy-default blocking       reused", "non-blocking   non-blocking   new-each-iteration",
        "shared         shared         reused"})
    EXPECT_NE(text.find(line), std::string::npos) << line;

  // One named track per stream of each configuration; trace_write would refuse otherwise.
  const nlohmann::json doc = trace_gather(trace, *world_, dev());
  if (world_->rank() != 0) return;
  const auto problems = trace_check(doc);
  EXPECT_TRUE(problems.empty()) << problems.front();
  const std::set<std::string> tracks = named_tracks(doc);
  for (const char* name :
       {"compute [legacy-default, reused]", "compute [legacy-default, new-each-iteration]",
        "compute [blocking, reused]", "compute [non-blocking, new-each-iteration]"})
    EXPECT_TRUE(tracks.count(name)) << name;
  const std::string comm = r.comm;
  for (const std::string& name :
       {comm + " [blocking, reused]", comm + " [non-blocking, new-each-iteration]",
        "compute + " + comm + " [shared, reused]"})
    EXPECT_TRUE(tracks.count(name)) << name;
}

TEST_F(CudaProbeTest, SerializeGivesNoOverlap) {
  OverlapOptions o;
  o.gemm_n = 64;
  o.bytes = 65536;
  o.warmup = 1;
  o.iters = 4;
  o.compute_pad_ms = kPadMs;
  o.comm_pad_ms = kPadMs;
  o.serialize = true;
  o.configs = {{StreamKind::non_blocking, StreamKind::non_blocking, StreamLifetime::reused}};
  const OverlapReport r = probe_overlap(backend(), *world_, o);
  ASSERT_EQ(r.rows.size(), 1u);
  for (const OverlapMeasure* m : {&r.rows[0].semantics, &r.rows[0].sharing}) {
    EXPECT_LE(m->overlap, 0.3) << m->t_both_ms;
    EXPECT_GE(m->t_both_ms, 2 * kPadMs - 5);
  }
}

// The default run, calibrated: a train of 8 bf16 GEMMs of ~2.5 ms each against a
// communication of ~20 ms (one rank: a copy to pinned host memory on a copy engine; several:
// NCCL's all-gather), the communication issued first. Under stream semantics (sleeps that
// hold no SM) the stream rules alone decide: legacy-default compute beside a blocking
// communication stream serialises, as does the control, and every other pairing overlaps.
// Under sharing the GEMMs and the transfer contend for memory bandwidth (and, with NCCL,
// SMs): whatever that costs on this GPU, a configuration the streams allow is never blamed
// on them.
TEST_F(CudaProbeTest, OverlapCalibrated) {
  OverlapOptions o;
  const OverlapReport r = probe_overlap(backend(), *world_, o);
  std::printf("%s", overlap_format(r).c_str());
  EXPECT_TRUE(r.gemm_calibrated);
  EXPECT_TRUE(r.bytes_calibrated);
  EXPECT_TRUE(r.gemm_bf16);
  EXPECT_EQ(r.train, 8);
  EXPECT_GE(r.gemm_n, 512);
  ASSERT_EQ(r.rows.size(), 13u);
  for (const auto& row : r.rows) {
    const std::string what = row.config.label();
    const bool serialised = row.config.compute == StreamKind::shared ||
                            (row.config.compute == StreamKind::legacy_default &&
                             row.config.comm == StreamKind::blocking);
    EXPECT_GT(row.semantics.t_compute_ms, 5) << what;
    EXPECT_GT(row.semantics.t_comm_ms, 5) << what;
    EXPECT_EQ(row.semantics.verdict, serialised ? "no overlap" : "overlaps") << what;
    if (serialised) {
      EXPECT_EQ(row.sharing.verdict, "no overlap") << what;
      EXPECT_EQ(row.limited_by, "streams") << what;
    } else {
      EXPECT_NE(row.limited_by, "streams") << what;
    }
  }
}

// ---- the links probe ----

TEST_F(CudaProbeTest, LinksAreRightAndCountACorruption) {
  LinksOptions o;
  o.max_bytes = size_t{4} << 20;
  const LinksReport r = probe_links(backend(), *world_, o);
  std::printf("%s", links_format(r).c_str());
  EXPECT_EQ(r.wrong_total(), 0u);
  ASSERT_EQ(r.results.size(), 3u);
  for (const auto& [op, rows] : r.results) {
    EXPECT_EQ(rows.size(), 13u) << collective_key(op);  // 1 KiB .. 4 MiB
    for (const auto& row : rows) {
      EXPECT_GT(row.time_us, 0) << collective_key(op) << " " << row.bytes;
      if (world_->size() == 1) {
        EXPECT_EQ(row.busbw_GBps, 0.0);
      }
    }
  }
  const nlohmann::json j = links_to_json(r);
  EXPECT_EQ(j.at("device"), "cuda");
  ASSERT_EQ(j.at("topology").at("ranks").size(), static_cast<size_t>(world_->size()));
  EXPECT_EQ(j.at("topology").at("ranks")[0].at("device"), "cuda");

  o.max_bytes = 8192;
  o.corrupt = links_corrupt_first(Collective::all_gather, world_->size());
  const LinksReport bad = probe_links(backend(), *world_, o);
  EXPECT_EQ(bad.wrong_total(), 1u);
  EXPECT_EQ(bad.results[0].second[0].wrong, 1u);  // the first size only
}

// ---- the compute probe ----

TEST_F(CudaProbeTest, ComputeMeasuresGemmsAndCopies) {
  ComputeOptions o;
  o.sizes = {256, 2048};
  o.copy_bytes = size_t{256} << 20;
  const ComputeReport r = probe_compute(backend(), o);
  std::printf("%s", compute_format(r).c_str());
  ASSERT_EQ(r.f32.size(), 2u);
  ASSERT_EQ(r.bf16.size(), 2u);
  for (const auto& g : r.f32) EXPECT_GT(g.tflops, 0) << g.n;
  for (const auto& g : r.bf16) EXPECT_GT(g.tflops, 0) << g.n;
  EXPECT_GT(r.tflops_f32, 0);
  ASSERT_TRUE(r.tflops_bf16.has_value());
  EXPECT_GT(*r.tflops_bf16, 0);
  EXPECT_GT(r.copy_GBps, 0);
  EXPECT_GT(r.mem_GiB, 1);
  const nlohmann::json j = compute_to_json(r);
  EXPECT_EQ(j.at("device"), "cuda");  // the planner's key: the kind, not the GPU's name
  EXPECT_FALSE(j.at("tflops_bf16").is_null());
}

// The kernel tables of a model's step through the CUDA bf16 table (cuBLASLt, flash attention):
// every call of the step measured, and the planner prices the model from exactly those.
TEST_F(CudaProbeTest, ComputeKernelTablesOfAModel) {
  ComputeOptions o;
  o.sizes = {256};
  o.copy_bytes = size_t{64} << 20;
  o.model = preset("gpt2-tiny");
  o.batch = 2;
  o.seq = 64;
  const ComputeReport r = probe_compute(backend(), o);
  std::printf("%s", compute_format(r).c_str());
  ASSERT_TRUE(r.kernels.has_value());
  const KernelRates& k = *r.kernels;
  EXPECT_EQ(k.compute_bytes, 2u);
  EXPECT_GT(k.launch_us, 0);
  EXPECT_EQ(k.optimizer_GBps, 0);  // measured on CPUs only
  const ModelLayout m(*o.model);
  const std::vector<KernelCall> calls =
      model_kernel_calls(m, 2, 64, kernel_traits_for(true, 2, o.model->head_dim()));
  EXPECT_EQ(k.entries.size(), calls.size() + 1);  // and add at the residual's size
  for (const KernelEntry& e : k.entries) EXPECT_GT(e.ms, 0) << kernel_call_text(e.call);

  PlanRequest req;
  req.model = *o.model;
  req.batch = 2;
  req.seq = 64;
  req.strategy = "full";
  req.hw = hardware_preset("h200-sxm");
  hardware_apply_compute(req.hw, compute_to_json(r));
  const PlanResult plan = plan_run(req);
  ASSERT_TRUE(plan.kernel_cost.has_value());
  EXPECT_EQ(plan.kernel_cost->measured, plan.kernel_cost->calls);
  EXPECT_GT(plan.strategies.at(0).step_ms, 0);
}

}  // namespace
}  // namespace tandem
