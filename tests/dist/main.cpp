// Entry point of the distributed tests: brings up the world communicator on a CPU device
// (MPI under mpirun, the one-rank communicator otherwise), runs GoogleTest on every rank,
// and makes every rank exit nonzero when any rank failed. `--ranks N` reruns the binary
// through the local launcher instead (its end-to-end test).
//
// [Dist test output] Only rank 0 prints GoogleTest's normal output; other ranks print just
// their failures, prefixed with their rank. Every test must issue the same collectives in
// the same order on every rank, so a test that skips does so on every rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "api/environment.h"
#include "cli/launch.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "dist/dist_env.h"

namespace tandem::dist {

namespace {
Environment g_environment;
std::unique_ptr<Device> g_device;
std::unique_ptr<Communicator> g_world;

// Failures of a rank other than 0, one block each.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The test is remembered here: UnitTest::current_test_info() would deadlock inside
  // OnTestPartResult, which GoogleTest calls under the same lock.
  void OnTestStart(const testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() != nullptr ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

// The value of "--ranks N" / "--ranks=N", or 0.
int ranks_flag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) return std::atoi(argv[i + 1]);
    if (std::strncmp(argv[i], "--ranks=", 8) == 0) return std::atoi(argv[i] + 8);
  }
  return 0;
}
}  // namespace

const Environment& environment() {
  return g_environment;
}
Device& device() {
  return *g_device;
}
Communicator& world() {
  return *g_world;
}

}  // namespace tandem::dist

int main(int argc, char** argv) {
  using namespace tandem;
  try {
    dist::g_environment = environment_from_process();
    const LaunchEnvironment& launch = dist::g_environment.launch;
    const int ranks = dist::ranks_flag(argc, argv);
    if (ranks > 0 && !launch.mpi)
      return launch_local_ranks(ranks, launch_strip_ranks(argc, argv), launch);

    testing::InitGoogleTest(&argc, argv);
    dist::g_device = device_create_cpu();
    CommOptions comm;
    comm.mpi = launch.mpi;
    dist::g_world = comm_world(*dist::g_device, comm);
    Communicator& world = *dist::g_world;
    if (world.rank() != 0) {
      testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new dist::FailurePrinter(world.rank()));
    }
    const int result = RUN_ALL_TESTS();

    // Agree on the outcome, so that every rank exits nonzero when any rank failed.
    float failed = result != 0 ? 1.0f : 0.0f;
    auto stream = dist::g_device->stream_create("outcome");
    world.all_reduce(*stream, &failed, &failed, 1, DType::f32, "test outcome");
    dist::g_device->stream_sync(*stream);
    if (world.rank() == 0 && failed > 0)
      std::fprintf(stderr, "%d of %d ranks had failures\n", static_cast<int>(failed), world.size());
    stream.reset();
    dist::g_world.reset();
    comm_finalize();
    dist::g_device.reset();
    return failed > 0 ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "tandem_dist_tests: %s\n", e.describe().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_dist_tests: %s\n", e.what());
  }
  comm_abort(2);
}
