// The CPU device: memory, stream ordering through events, host waits, concurrency, error
// propagation ([CPU stream errors]), timing events, and a randomized DAG stress test that
// also runs under ThreadSanitizer.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "device/device.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

// Long enough never to fire on a loaded machine; short enough that a broken device fails
// the suite instead of hanging it.
constexpr auto kTimeout = 20s;

// A one-shot gate: open() once, wait() until open or the timeout passes.
class Latch {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout = kTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Tests declare the state their tasks touch (latches, flags) before the streams, so that
// it outlives the worker threads, which are joined when the streams are destroyed.

// Runs fn, which must throw an exception of type E whose what() contains `needle`.
template <typename E, typename Fn>
void expect_throw_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// --- device creation ---------------------------------------------------------------------

TEST(CpuDevice, NameAndKind) {
  auto dev = device_create_cpu();
  EXPECT_EQ(dev->kind(), DeviceKind::cpu);
  EXPECT_EQ(dev->name(), "cpu");
  auto dev2 = device_create(DeviceKind::cpu);
  EXPECT_EQ(dev2->kind(), DeviceKind::cpu);
}

TEST(CpuDevice, KindParse) {
  EXPECT_EQ(device_kind_parse("cpu"), DeviceKind::cpu);
  EXPECT_EQ(device_kind_parse("cuda"), DeviceKind::cuda);
  expect_throw_containing<Error>([] { device_kind_parse("tpu"); },
                                 "unknown device 'tpu' (expected cpu or cuda)");
  expect_throw_containing<Error>([] { device_kind_parse(""); }, "unknown device ''");
}

TEST(CpuDevice, CudaDeviceWithoutAGpuFailsClearly) {
#ifdef TANDEM_HAVE_CUDA
  // Built with CUDA: on a machine without a GPU (CI) creating a device says so; with a GPU
  // it succeeds (the GPU tests cover it).
  try {
    auto dev = device_create_cuda(0);
    EXPECT_EQ(dev->kind(), DeviceKind::cuda);
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot create CUDA device 0"), std::string::npos) << e.message();
  }
#else
  expect_throw_containing<Error>([] { device_create_cuda(0); }, "built without the CUDA backend");
  expect_throw_containing<Error>([] { device_create(DeviceKind::cuda, 1); },
                                 "cannot create CUDA device 1");
#endif
}

// --- memory ------------------------------------------------------------------------------

TEST(CpuDevice, AllocAlignedAndCopies) {
  auto dev = device_create_cpu();
  for (size_t bytes : {1, 3, 64, 100, 4096, 1 << 20}) {
    void* p = dev->alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    std::vector<unsigned char> src(bytes), dst(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
    dev->copy_to_device(p, src.data(), bytes);
    dev->copy_to_host(dst.data(), p, bytes);
    EXPECT_EQ(src, dst);
    dev->free(p);
  }
}

TEST(CpuDevice, AllocZeroAndFailure) {
  auto dev = device_create_cpu();
  EXPECT_EQ(dev->alloc(0), nullptr);  // consistently nullptr, like cudaMalloc(0)
  EXPECT_EQ(dev->alloc(0), nullptr);
  dev->free(nullptr);
  dev->copy_to_device(nullptr, nullptr, 0);
  dev->copy_to_host(nullptr, nullptr, 0);
  expect_throw_containing<Error>([&] { dev->alloc(SIZE_MAX); }, std::to_string(SIZE_MAX));
}

// --- ordering ----------------------------------------------------------------------------

TEST(CpuDevice, OrderingAcrossThreeStreams) {
  // A writes, B transforms, C reads; each producer sleeps first, so a missing wait would
  // read the -1s the buffers start with.
  auto dev = device_create_cpu();
  auto a = dev->stream_create("a");
  auto b = dev->stream_create("b");
  auto c = dev->stream_create("c");
  auto e1 = dev->event_create();
  auto e2 = dev->event_create();
  constexpr int kN = 1024;
  for (int round = 0; round < 5; ++round) {
    std::vector<int> buf(kN, -1), out(kN, -1), seen;
    dev->submit(*a, [&] {
      std::this_thread::sleep_for(20ms);
      for (int i = 0; i < kN; ++i) buf[i] = i + round;
    });
    dev->event_record(*e1, *a);
    dev->stream_wait(*b, *e1);
    dev->submit(*b, [&] {
      std::this_thread::sleep_for(20ms);
      for (int i = 0; i < kN; ++i) out[i] = buf[i] * 2;
    });
    dev->event_record(*e2, *b);
    dev->stream_wait(*c, *e2);
    dev->submit(*c, [&] { seen = out; });
    dev->stream_sync(*c);  // C's sync covers A and B through the events
    ASSERT_EQ(seen.size(), static_cast<size_t>(kN));
    for (int i = 0; i < kN; ++i) ASSERT_EQ(seen[i], 2 * (i + round)) << "round " << round;
  }
}

TEST(CpuDevice, FifoWithinStream) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("fifo");
  std::vector<int> order;
  for (int i = 0; i < 1000; ++i) dev->submit(*s, [&order, i] { order.push_back(i); });
  dev->stream_sync(*s);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
}

// --- host waits --------------------------------------------------------------------------

TEST(CpuDevice, EventWaitReturnsAfterTheTaskRan) {
  auto dev = device_create_cpu();
  Latch gate;
  bool ran = false;  // written by the task, read by the host after event_wait
  auto s = dev->stream_create("s");
  auto e = dev->event_create();
  dev->submit(*s, [&] {
    gate.wait();
    ran = true;
  });
  dev->event_record(*e, *s);
  EXPECT_FALSE(dev->event_query(*e));
  gate.open();
  dev->event_wait(*e);
  EXPECT_TRUE(ran);
  EXPECT_TRUE(dev->event_query(*e));
}

TEST(CpuDevice, StreamSyncDrains) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("s");
  int count = 0;
  for (int i = 0; i < 50; ++i) {
    dev->submit(*s, [&count, i] {
      if (i % 10 == 0) std::this_thread::sleep_for(1ms);
      ++count;
    });
  }
  dev->stream_sync(*s);
  EXPECT_EQ(count, 50);
  dev->stream_sync(*s);  // an idle stream syncs at once
}

TEST(CpuDevice, WaitOnNeverRecordedEventIsNoOp) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("s");
  auto e = dev->event_create();
  EXPECT_TRUE(dev->event_query(*e));
  dev->event_wait(*e);
  dev->stream_wait(*s, *e);
  bool ran = false;
  dev->submit(*s, [&] { ran = true; });
  dev->stream_sync(*s);
  EXPECT_TRUE(ran);
}

TEST(CpuDevice, WaitCapturesTheRecordAtCallTime) {
  auto dev = device_create_cpu();
  Latch gate, b_ran;
  auto a = dev->stream_create("a");
  auto b = dev->stream_create("b");
  auto e = dev->event_create();

  // Record 1 completes at once; the re-record behind a closed gate does not.
  dev->event_record(*e, *a);
  dev->stream_wait(*b, *e);  // captures record 1
  dev->submit(*a, [&] { gate.wait(); });
  dev->event_record(*e, *a);  // record 2, blocked behind the gate
  dev->submit(*b, [&] { b_ran.open(); });
  // B waits only for record 1: it runs while record 2 is still pending.
  EXPECT_TRUE(b_ran.wait());
  // The host captures record 2 now.
  EXPECT_FALSE(dev->event_query(*e));
  gate.open();
  dev->event_wait(*e);
  EXPECT_TRUE(dev->event_query(*e));
  dev->stream_sync(*b);  // B's task may still be returning from b_ran.open()
}

TEST(CpuDevice, LaterRecordOnAnotherStreamDoesNotReleaseEarlierWait) {
  auto dev = device_create_cpu();
  Latch gate;
  std::atomic<bool> a_done{false}, b_ran{false}, b_saw_a{false};
  auto a = dev->stream_create("a");
  auto b = dev->stream_create("b");
  auto c = dev->stream_create("c");
  auto e = dev->event_create();
  dev->submit(*a, [&] {
    gate.wait();
    a_done = true;
  });
  dev->event_record(*e, *a);  // record 1: pending behind the gate
  dev->stream_wait(*b, *e);   // B captures record 1
  dev->submit(*b, [&] {
    b_saw_a = a_done.load();
    b_ran = true;
  });
  dev->event_record(*e, *c);  // record 2 on an idle stream: completes at once
  dev->event_wait(*e);        // the host captured record 2
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_ran.load());  // B still waits for record 1
  gate.open();
  dev->stream_sync(*b);
  EXPECT_TRUE(b_ran.load());
  EXPECT_TRUE(b_saw_a.load());
}

TEST(CpuDevice, EventOutlivedByItsPendingRecord) {
  auto dev = device_create_cpu();
  Latch gate;
  bool ran = false;
  auto s = dev->stream_create("s");
  auto t = dev->stream_create("t");
  {
    auto e = dev->event_create(true);
    dev->submit(*s, [&] { gate.wait(); });
    dev->event_record(*e, *s);
    dev->stream_wait(*t, *e);
  }  // the event is gone while its record and a wait on it are queued
  dev->submit(*t, [&] { ran = true; });
  gate.open();
  dev->stream_sync(*t);
  EXPECT_TRUE(ran);
}

TEST(CpuDevice, DestructionDrainsPendingWork) {
  auto dev = device_create_cpu();
  std::atomic<int> count{0};
  {
    auto s = dev->stream_create("drain");
    for (int i = 0; i < 100; ++i) {
      dev->submit(*s, [&count, i] {
        if (i % 25 == 0) std::this_thread::sleep_for(2ms);
        ++count;
      });
    }
  }
  EXPECT_EQ(count.load(), 100);
}

// --- concurrency and thread names --------------------------------------------------------

TEST(CpuDevice, StreamsRunConcurrently) {
  // A's task blocks until B's task runs: serialized streams would time out, not hang.
  auto dev = device_create_cpu();
  Latch flag;
  bool a_saw_flag = false;
  auto a = dev->stream_create("a");
  auto b = dev->stream_create("b");
  dev->submit(*a, [&] { a_saw_flag = flag.wait(); });
  dev->submit(*b, [&] { flag.open(); });
  dev->stream_sync(*a);
  dev->stream_sync(*b);
  EXPECT_TRUE(a_saw_flag);
}

TEST(CpuDevice, WorkerThreadCarriesTheStreamName) {
  auto dev = device_create_cpu();
  auto a = dev->stream_create("compute");
  auto b = dev->stream_create("reduce-scatter-stream-0");
  char name_a[32] = {}, name_b[32] = {};
  dev->submit(*a, [&] { pthread_getname_np(pthread_self(), name_a, sizeof(name_a)); });
  dev->submit(*b, [&] { pthread_getname_np(pthread_self(), name_b, sizeof(name_b)); });
  dev->stream_sync(*a);
  dev->stream_sync(*b);
  EXPECT_STREQ(name_a, "compute");
  EXPECT_STREQ(name_b, "reduce-scatter-");  // truncated to 15 characters
  EXPECT_EQ(b->name(), "reduce-scatter-stream-0");
}

// --- errors ([CPU stream errors]) --------------------------------------------------------

TEST(CpuDevice, ThrowingTaskMakesStreamSyncRethrow) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("s");
  int after = 0;
  dev->submit(*s, [] { throw std::runtime_error("boom"); });
  dev->submit(*s, [&] { ++after; });  // skipped: the stream has failed
  expect_throw_containing<std::runtime_error>([&] { dev->stream_sync(*s); }, "boom");
  EXPECT_EQ(after, 0);
  // Sticky: later work is skipped and every sync rethrows.
  dev->submit(*s, [&] { ++after; });
  expect_throw_containing<std::runtime_error>([&] { dev->stream_sync(*s); }, "boom");
  EXPECT_EQ(after, 0);
}

TEST(CpuDevice, ThrowingTaskMakesEventWaitRethrow) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("s");
  auto e = dev->event_create();
  dev->submit(*s, [] { TD_THROW("kernel {} failed", 7); });
  dev->event_record(*e, *s);
  expect_throw_containing<Error>([&] { dev->event_wait(*e); }, "kernel 7 failed");
  expect_throw_containing<Error>([&] { dev->event_query(*e); }, "kernel 7 failed");
}

TEST(CpuDevice, FailurePropagatesAlongWaits) {
  auto dev = device_create_cpu();
  auto a = dev->stream_create("a");
  auto b = dev->stream_create("b");
  auto c = dev->stream_create("c");
  auto ea = dev->event_create();
  auto eb = dev->event_create();
  std::atomic<int> ran{0};
  dev->submit(*a, [] { throw std::runtime_error("root cause"); });
  dev->event_record(*ea, *a);
  dev->submit(*b, [&] { ++ran; });  // before the wait: runs
  dev->stream_wait(*b, *ea);
  dev->submit(*b, [&] { ran += 100; });  // after the failed wait: skipped
  dev->event_record(*eb, *b);
  dev->stream_wait(*c, *eb);
  dev->submit(*c, [&] { ran += 1000; });  // transitively failed: skipped
  expect_throw_containing<std::runtime_error>([&] { dev->stream_sync(*c); }, "root cause");
  expect_throw_containing<std::runtime_error>([&] { dev->stream_sync(*b); }, "root cause");
  expect_throw_containing<std::runtime_error>([&] { dev->event_wait(*eb); }, "root cause");
  EXPECT_EQ(ran.load(), 1);
  // An unrelated stream is unaffected.
  auto d = dev->stream_create("d");
  dev->submit(*d, [&] { ++ran; });
  dev->stream_sync(*d);
  EXPECT_EQ(ran.load(), 2);
}

TEST(CpuDevice, DestructionAfterFailureDoesNotHang) {
  auto dev = device_create_cpu();
  auto other = dev->stream_create("other");
  auto e = dev->event_create();
  {
    auto s = dev->stream_create("doomed");
    dev->submit(*s, [] { throw 42; });  // not even a std::exception
    for (int i = 0; i < 100; ++i) dev->submit(*s, [] { std::this_thread::sleep_for(1s); });
    dev->event_record(*e, *s);
    dev->stream_wait(*s, *e);
  }  // destroyed without a sync: drains (skipping work) and joins
  dev->stream_wait(*other, *e);
  try {
    dev->stream_sync(*other);
    ADD_FAILURE() << "expected the failure to propagate";
  } catch (int v) {
    EXPECT_EQ(v, 42);
  }
}

TEST(CpuDevice, StreamSyncFromOwnTaskIsAnError) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("self");
  Stream& ref = *s;
  dev->submit(*s, [&] { dev->stream_sync(ref); });
  expect_throw_containing<Error>([&] { dev->stream_sync(*s); }, "would deadlock");
}

// --- timing ------------------------------------------------------------------------------

TEST(CpuDevice, TimingEventsMeasureElapsed) {
  auto dev = device_create_cpu();
  auto s = dev->stream_create("s");
  auto start = dev->event_create(true);
  auto end = dev->event_create(true);
  dev->event_record(*start, *s);
  dev->submit(*s, [] { std::this_thread::sleep_for(30ms); });
  dev->event_record(*end, *s);
  dev->stream_sync(*s);
  const double ms = dev->event_elapsed_ms(*start, *end);
  EXPECT_GE(ms, 30.0);
  EXPECT_LT(ms, 30000.0);
}

TEST(CpuDevice, ElapsedNeedsCompletedTimingEvents) {
  auto dev = device_create_cpu();
  Latch gate;
  auto s = dev->stream_create("s");
  auto timed = dev->event_create(true);
  auto untimed = dev->event_create(false);
  auto pending = dev->event_create(true);
  auto never = dev->event_create(true);
  dev->event_record(*timed, *s);
  dev->event_record(*untimed, *s);
  dev->stream_sync(*s);
  expect_throw_containing<Error>([&] { dev->event_elapsed_ms(*timed, *untimed); }, "timing");
  expect_throw_containing<Error>([&] { dev->event_elapsed_ms(*untimed, *timed); }, "timing");
  expect_throw_containing<Error>([&] { dev->event_elapsed_ms(*timed, *never); }, "never recorded");
  dev->submit(*s, [&] { gate.wait(); });
  dev->event_record(*pending, *s);
  expect_throw_containing<Error>([&] { dev->event_elapsed_ms(*timed, *pending); },
                                 "has not completed");
  gate.open();
  dev->stream_sync(*s);
  EXPECT_GE(dev->event_elapsed_ms(*timed, *pending), 0.0);
}

// --- stress ------------------------------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A random DAG of tasks over several streams. Task i reads the values of a few earlier
// tasks and writes its own; cross-stream dependencies are ordered only by events: either
// the dependency's own event, or its stream's rolling event (re-recorded after every task,
// so the wait captures a later record of the same stream, which also covers it). The
// result must equal a sequential evaluation, and TSAN must see no race.
void run_dag(uint64_t seed, int streams, int tasks) {
  auto dev = device_create_cpu();
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<Stream>> ss;
  std::vector<std::unique_ptr<Event>> rolling;
  for (int s = 0; s < streams; ++s) {
    ss.push_back(dev->stream_create("dag" + std::to_string(s)));
    rolling.push_back(dev->event_create());
  }
  std::vector<std::unique_ptr<Event>> own;
  for (int i = 0; i < tasks; ++i) own.push_back(dev->event_create(i % 7 == 0));

  std::vector<uint64_t> value(tasks, 0), expect(tasks, 0);
  std::vector<int> stream_of(tasks);
  for (int i = 0; i < tasks; ++i) {
    const int s = static_cast<int>(rng() % streams);
    stream_of[i] = s;
    std::vector<int> deps;
    const int ndeps = i == 0 ? 0 : static_cast<int>(rng() % 4);
    for (int k = 0; k < ndeps; ++k) {
      // Mostly recent tasks (real contention), sometimes anything earlier.
      const int span = rng() % 4 == 0 ? i : std::min(i, 16);
      deps.push_back(i - 1 - static_cast<int>(rng() % span));
    }
    uint64_t h = mix(seed ^ static_cast<uint64_t>(i));
    for (int d : deps) h = mix(h ^ expect[d]);
    expect[i] = h;

    for (int d : deps) {
      if (stream_of[d] == s) continue;  // FIFO already orders it
      Event& ev = rng() % 2 == 0 ? *own[d] : *rolling[stream_of[d]];
      dev->stream_wait(*ss[s], ev);
    }
    const uint64_t base = mix(seed ^ static_cast<uint64_t>(i));
    dev->submit(*ss[s], [&value, deps, base, i] {
      uint64_t x = base;
      for (int d : deps) x = mix(x ^ value[d]);
      value[i] = x;
    });
    dev->event_record(*own[i], *ss[s]);
    dev->event_record(*rolling[s], *ss[s]);

    // The host joins in now and then.
    const uint64_t r = rng() % 64;
    if (r == 0) {
      dev->event_wait(*own[i]);
      EXPECT_EQ(value[i], expect[i]);
    } else if (r == 1) {
      (void)dev->event_query(*own[rng() % (i + 1)]);
    } else if (r == 2) {
      dev->stream_sync(*ss[rng() % streams]);
    }
  }
  for (auto& s : ss) dev->stream_sync(*s);
  for (int i = 0; i < tasks; ++i) ASSERT_EQ(value[i], expect[i]) << "task " << i;
  // Timing events recorded on one stream in order measure non-negative spans.
  int prev = -1;
  for (int i = 0; i < tasks; i += 7) {
    if (stream_of[i] != stream_of[0]) continue;
    if (prev >= 0) {
      EXPECT_GE(dev->event_elapsed_ms(*own[prev], *own[i]), 0.0);
    }
    prev = i;
  }
}

TEST(CpuDevice, StressRandomDag) {
  for (uint64_t seed : {1, 2, 3}) run_dag(seed, 5, 3000);
}

TEST(CpuDevice, StressRandomDagTwoStreams) {
  run_dag(99, 2, 4000);
}

}  // namespace
}  // namespace tandem
