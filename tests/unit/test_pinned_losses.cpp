// Pins the CPU training losses of the tiny GPT-2 and Llama models bit for bit: the fp32
// CPU path is deterministic (fixed reduction orders, any thread count), so a change to the
// model composition, the kernels or the engine that alters one rounding anywhere shows up
// here. The pinned values were produced by `tandem train` with exactly these flags; a
// change of summation order made on purpose must update them and say why in its commit.
//
// [Pins per BLAS kernel] OpenBLAS picks its GEMM kernels by processor (or by
// OPENBLAS_CORETYPE, which some machines set), and kernels of different cores sum in
// different orders. So the losses are pinned per OpenBLAS core: bit for bit on a core with
// pins, and on any other core within 2e-5 of the first pins. Four cores (Cooperlake,
// Haswell, SkylakeX, Sandybridge) spread by at most 2e-6 over these four steps: fp32 sums
// of a few thousand terms differ in their last bits, and training carries that on.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "unit/cli_runner.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using cli_test::run_tandem;
using cli_test::succeeded;

// 6000 printable bytes from a fixed linear congruential sequence.
std::string pinned_text() {
  std::string t;
  uint64_t s = 12345;
  for (int i = 0; i < 6000; ++i) {
    s = s * 6364136223846793005ull + 1;
    t.push_back(static_cast<char>(32 + (s >> 33) % 90));
  }
  return t;
}

std::vector<double> train_losses(const std::string& model, const fs::path& dir) {
  const fs::path text = dir / "text.txt", data = dir / "data.tok", metrics = dir / "m.jsonl";
  std::ofstream(text, std::ios::binary) << pinned_text();
  EXPECT_TRUE(
      succeeded(run_tandem({"data", "prepare", "--text", text.string(), "--out", data.string()})));
  // Two micro-steps of 2 sequences: gradient accumulation is part of what is pinned.
  EXPECT_TRUE(succeeded(run_tandem({"train",
                                    "--model",
                                    model,
                                    "--data",
                                    data.string(),
                                    "--batch",
                                    "2",
                                    "--global-batch",
                                    "4",
                                    "--seq",
                                    "32",
                                    "--steps",
                                    "4",
                                    "--seed",
                                    "7",
                                    "--lr",
                                    "3e-3",
                                    "--warmup",
                                    "1",
                                    "--metrics",
                                    metrics.string(),
                                    "--progress",
                                    "none"},
                                   120)));
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss") && j.contains("step")) losses.push_back(j.at("loss").get<double>());
  }
  return losses;
}

struct Pinned {
  const char* model;
  // OpenBLAS core name -> losses; the first entry is the reference for cores without pins.
  std::vector<std::pair<std::string, std::vector<double>>> losses;
};

constexpr double kOtherCoreTolerance = 2e-5;  // [Pins per BLAS kernel]

class PinnedLosses : public testing::TestWithParam<Pinned> {};

TEST_P(PinnedLosses, CpuLossesAreBitwiseThePinnedOnes) {
  const Pinned& p = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("tandem-pinned-" + std::string(p.model));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<double> losses = train_losses(p.model, dir);
  // The child runs in this process's environment, so it picks the same core.
  const std::string core = openblas_get_corename();
  const auto pinned = std::find_if(p.losses.begin(), p.losses.end(),
                                   [&](const auto& e) { return e.first == core; });
  const std::vector<double>& want =
      pinned != p.losses.end() ? pinned->second : p.losses.front().second;
  ASSERT_EQ(losses.size(), want.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    if (pinned != p.losses.end())
      EXPECT_EQ(losses[i], want[i]) << p.model << " step " << i + 1 << " on OpenBLAS " << core
                                    << std::setprecision(17) << ": got " << losses[i];
    else
      EXPECT_NEAR(losses[i], want[i], kOtherCoreTolerance)
          << p.model << " step " << i + 1 << " on OpenBLAS " << core << " (no pins; compared with "
          << p.losses.front().first << "'s)";
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, PinnedLosses,
    testing::Values(
        Pinned{
            "gpt2-tiny",
            {{"Cooperlake",
              {5.58084025606513, 5.4471586011350155, 5.194814007729292, 5.011130724102259}},
             {"Haswell",
              {5.5808402374386787, 5.4471589513123035, 5.1948140114545822, 5.0111306682229042}}}},
        Pinned{"llama-tiny",
               {{"Cooperlake",
                 {5.564221486449242, 5.507355511188507, 5.369931191205978, 5.081348933279514}},
                {"Haswell",
                 {5.564221478998661, 5.5073547698557377, 5.369931798428297, 5.0813477449119091}}}}),
    [](const testing::TestParamInfo<Pinned>& i) {
      std::string n = i.param.model;
      for (char& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

}  // namespace
}  // namespace tandem
