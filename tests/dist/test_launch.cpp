// The local launcher's argument handling: launch_strip_ranks removes --ranks in both
// spellings and nothing else, and launch_local_ranks refuses what it cannot run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/launch.h"
#include "core/error.h"
#include "dist/dist_env.h"

namespace tandem {
namespace {

using Args = std::vector<std::string>;

Args strip(const std::vector<const char*>& argv) {
  return launch_strip_ranks(static_cast<int>(argv.size()), argv.data());
}

TEST(LaunchStripRanks, DropsArgv0AndKeepsEverythingElse) {
  EXPECT_EQ(strip({"tandem"}), Args{});
  EXPECT_EQ(strip({"tandem", "train", "--steps", "5"}), (Args{"train", "--steps", "5"}));
}

TEST(LaunchStripRanks, RemovesBothSpellingsAnywhere) {
  EXPECT_EQ(strip({"tandem", "--ranks", "4", "train"}), Args{"train"});
  EXPECT_EQ(strip({"tandem", "train", "--ranks", "4", "--steps", "5"}),
            (Args{"train", "--steps", "5"}));
  EXPECT_EQ(strip({"tandem", "train", "--ranks", "2"}), Args{"train"});
  EXPECT_EQ(strip({"tandem", "train", "--ranks=3"}), Args{"train"});
  EXPECT_EQ(strip({"tandem", "--ranks=1", "train", "--ranks", "2", "--ranks=16"}), Args{"train"});
}

TEST(LaunchStripRanks, LeavesLookAlikesAndPositionalsAlone) {
  EXPECT_EQ(strip({"tandem", "--ranks-per-node", "2", "--rank", "1", "-ranks", "3"}),
            (Args{"--ranks-per-node", "2", "--rank", "1", "-ranks", "3"}));
  EXPECT_EQ(strip({"tandem", "--ranksx=3"}), Args{"--ranksx=3"});
  EXPECT_EQ(strip({"tandem", "train", "--", "--ranks", "4", "--ranks=2"}),
            (Args{"train", "--", "--ranks", "4", "--ranks=2"}));
  // A value that merely looks like the option is consumed as the value of the one before.
  EXPECT_EQ(strip({"tandem", "--out", "--ranks=2"}), Args{"--out"});
}

TEST(LaunchStripRanks, RejectsMissingOrMalformedValues) {
  EXPECT_THROW(strip({"tandem", "train", "--ranks"}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks="}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks", "four"}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks", "-2"}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks=2x"}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks", "--steps", "5"}), Error);
  EXPECT_THROW(strip({"tandem", "--ranks=99999999999"}), Error);
}

TEST(LaunchLocalRanks, RefusesWhatItCannotRun) {
  const LaunchEnvironment& launch = dist::environment().launch;
  EXPECT_THROW(launch_local_ranks(0, {}, launch), Error);
  EXPECT_THROW(launch_local_ranks(-1, {}, launch), Error);
  if (launch.mpirun) {
    try {
      launch_local_ranks(2, {"--help"}, launch);
      ADD_FAILURE() << "launched mpirun from inside an MPI job";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("cannot be used in a process that an MPI launcher started"),
                std::string::npos)
          << e.message();
    }
  }
}

}  // namespace
}  // namespace tandem
