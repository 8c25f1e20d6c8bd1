// Pins the CPU training losses of the tiny GPT-2 and Llama models bit for bit: the fp32
// CPU path is deterministic (fixed reduction orders, any thread count), so a change to the
// model composition, the kernels or the engine that alters one rounding anywhere shows up
// here. The pinned values were produced by `tandem train` with exactly these flags; a
// change of summation order made on purpose must update them and say why in its commit.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
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
  std::vector<double> losses;
};

class PinnedLosses : public testing::TestWithParam<Pinned> {};

TEST_P(PinnedLosses, CpuLossesAreBitwiseThePinnedOnes) {
  const Pinned& p = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("tandem-pinned-" + std::string(p.model));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<double> losses = train_losses(p.model, dir);
  ASSERT_EQ(losses.size(), p.losses.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_EQ(losses[i], p.losses[i]) << p.model << " step " << i + 1;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Tiny, PinnedLosses,
                         testing::Values(Pinned{"gpt2-tiny",
                                                {5.58084025606513, 5.4471586011350155,
                                                 5.194814007729292, 5.011130724102259}},
                                         Pinned{"llama-tiny",
                                                {5.564221486449242, 5.507355511188507,
                                                 5.369931191205978, 5.081348933279514}}),
                         [](const testing::TestParamInfo<Pinned>& i) {
                           std::string n = i.param.model;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tandem
