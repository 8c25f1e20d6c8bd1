// The public API (include/tandem/), used as a program outside the library uses it: only
// the public headers are included here. Training with a callback, the metrics, save and
// resume through the API, model shapes, the planner, and errors as tandem::Error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <tandem/tandem.h>

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("tandem-api-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A short text repeated: the loss falls within a few steps.
fs::path write_data(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 64; ++i) text += "tandem replays one step program; ";
  const fs::path path = dir.path / "data.tok";
  tandem::write_token_file(path, tandem::byte_tokens(text));
  return path;
}

tandem::TrainConfig tiny_config(const fs::path& data, int steps) {
  tandem::TrainConfig c;
  c.model = "gpt2-tiny";
  c.data = data;
  c.batch = 2;
  c.seq = 32;
  c.steps = steps;
  c.optimizer.lr = 2e-3f;
  return c;
}

size_t count_lines(const fs::path& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"loss\"") != std::string::npos;
  return n;
}

}  // namespace

TEST(Api, RunCallsBackEveryStepWithItsMetrics) {
  TempDir dir;
  tandem::TrainConfig config = tiny_config(write_data(dir), 6);
  config.metrics_path = dir.path / "metrics.jsonl";
  tandem::Trainer trainer(config);
  EXPECT_EQ(trainer.rank(), 0);
  EXPECT_EQ(trainer.world_size(), 1);
  EXPECT_EQ(trainer.steps_done(), 0);
  EXPECT_EQ(trainer.config().global_batch, 2);  // resolved: batch x 1 rank
  EXPECT_EQ(trainer.model().name, "gpt2-tiny");

  std::vector<tandem::StepMetrics> seen;
  const tandem::StepMetrics last =
      trainer.run([&](const tandem::StepMetrics& m) { seen.push_back(m); });
  ASSERT_EQ(seen.size(), 6u);
  for (size_t i = 0; i < seen.size(); ++i) {
    const tandem::StepMetrics& m = seen[i];
    EXPECT_EQ(m.step, static_cast<int64_t>(i + 1));
    EXPECT_TRUE(std::isfinite(m.loss) && m.loss > 0) << m.loss;
    EXPECT_GT(m.lr, 0.0f);
    EXPECT_TRUE(std::isfinite(m.grad_norm) && m.grad_norm > 0) << m.grad_norm;
    EXPECT_GT(m.tokens_per_s, 0);
    EXPECT_GT(m.step_ms, 0);
    EXPECT_GE(m.compute_ms, 0);
    EXPECT_GE(m.comm_ms, 0);
    EXPECT_GE(m.exposed_comm_ms, 0);
    EXPECT_GT(m.peak_mem_bytes, 0u);
  }
  EXPECT_EQ(last.step, 6);
  EXPECT_EQ(last.loss, seen.back().loss);
  EXPECT_LT(seen.back().loss, seen.front().loss);
  EXPECT_EQ(trainer.steps_done(), 6);
  EXPECT_EQ(count_lines(config.metrics_path), 6u);

  // The run is complete: run() takes no further step.
  EXPECT_EQ(trainer.run().step, 0);
  // One rank, started by no launcher: nothing to finalise.
  EXPECT_NO_THROW(tandem::finalize());
}

TEST(Api, SaveAndResumeContinueTheRunExactly) {
  TempDir dir;
  const fs::path data = write_data(dir);
  std::vector<double> unbroken;
  {
    tandem::Trainer t(tiny_config(data, 8));
    t.run([&](const tandem::StepMetrics& m) { unbroken.push_back(m.loss); });
  }
  ASSERT_EQ(unbroken.size(), 8u);

  // The same run, stopped after 4 steps and saved ...
  const fs::path ckpt = dir.path / "ckpt";
  {
    tandem::Trainer t(tiny_config(data, 8));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(t.step().loss, unbroken[static_cast<size_t>(i)]);
    t.save(ckpt);
  }
  const tandem::ModelInfo saved = tandem::load_model_info(ckpt.string());
  EXPECT_EQ(saved.name, "gpt2-tiny");
  EXPECT_EQ(saved.checkpoint_step, 4);

  // ... then resumed, the model taken from the checkpoint: steps 5-8 are those of the
  // unbroken run, bit for bit, and run() writes the final checkpoint into save_dir.
  tandem::TrainConfig resume = tiny_config(data, 8);
  resume.model.clear();
  resume.resume_dir = ckpt;
  resume.save_dir = ckpt;
  tandem::Trainer t(resume);
  EXPECT_EQ(t.steps_done(), 4);
  EXPECT_EQ(t.model().name, "gpt2-tiny");
  EXPECT_EQ(t.model().checkpoint_step, 4);
  std::vector<double> resumed;
  t.run([&](const tandem::StepMetrics& m) { resumed.push_back(m.loss); });
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], unbroken[i + 4]) << "step " << i + 5;
  EXPECT_EQ(tandem::load_model_info(ckpt.string()).checkpoint_step, 8);
}

TEST(Api, BadConfigThrowsTandemErrorWithTheMessage) {
  TempDir dir;
  tandem::TrainConfig config = tiny_config(write_data(dir), 2);
  config.batch = 0;
  try {
    tandem::Trainer t(config);
    FAIL() << "a batch of 0 was accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(e.message().find("--batch must be positive, got 0"), std::string::npos)
        << e.message();
    EXPECT_EQ(std::string(e.what()), e.message());
    EXPECT_FALSE(e.call().empty());
    EXPECT_EQ(e.rank(), 0);
  }

  config = tiny_config(dir.path / "missing.tok", 2);
  try {
    tandem::Trainer t(config);
    FAIL() << "a missing token file was accepted";
  } catch (const tandem::Error& e) {
    EXPECT_NE(e.message().find("missing.tok"), std::string::npos) << e.message();
  }

  config = tiny_config(write_data(dir), 2);
  config.strategy = tandem::Strategy::hybrid;  // without a shard group
  EXPECT_THROW(tandem::Trainer{config}, tandem::Error);
  EXPECT_THROW(tandem::load_model_info("no-such-model"), tandem::Error);
  EXPECT_THROW(tandem::write_token_file(dir.path / "empty.tok", {}), tandem::Error);
  // Errors are std::runtime_errors too.
  EXPECT_THROW(tandem::load_model_info("no-such-model"), std::runtime_error);
}

TEST(Api, ModelInfoOfPresetsAndConfigs) {
  const std::vector<std::string> presets = tandem::model_presets();
  EXPECT_NE(std::find(presets.begin(), presets.end(), "gpt2-tiny"), presets.end());
  EXPECT_NE(std::find(presets.begin(), presets.end(), "llama-tiny"), presets.end());

  const tandem::ModelInfo m = tandem::load_model_info("gpt2-tiny");
  EXPECT_EQ(m.family, tandem::Family::gpt2);
  EXPECT_EQ(tandem::to_string(m.family), "gpt2");
  EXPECT_EQ(m.vocab, 256);
  EXPECT_EQ(m.context, 256);
  EXPECT_EQ(m.d_model, 128);
  EXPECT_EQ(m.n_layer, 4);
  EXPECT_EQ(m.n_head, 4);
  EXPECT_GT(m.num_params, 0);
  EXPECT_GE(m.num_params_padded, m.num_params);
  EXPECT_EQ(m.checkpoint_step, 0);
  EXPECT_EQ(tandem::load_model_info("llama-tiny").family, tandem::Family::llama);

  TempDir dir;
  const fs::path json = dir.path / "small.json";
  std::ofstream(json) << R"({"name": "small", "family": "llama", "vocab": 64, "context": 32,
                             "d_model": 24, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
                             "d_ff": 40})";
  const tandem::ModelInfo s = tandem::load_model_info(json.string());
  EXPECT_EQ(s.name, "small");
  EXPECT_EQ(s.family, tandem::Family::llama);
  EXPECT_EQ(s.n_kv_head, 2);
}

TEST(Api, PlanPredictsEveryStrategy) {
  tandem::PlanRequest r;
  r.model = "gpt2-tiny";
  r.ranks = 2;
  const tandem::PlanResult p = tandem::plan(r);
  ASSERT_EQ(p.strategies.size(), 3u);  // full, grad_op, none; hybrid needs a shard group
  EXPECT_EQ(p.strategies[0].strategy, tandem::Strategy::full);
  EXPECT_EQ(p.strategies[1].strategy, tandem::Strategy::grad_op);
  EXPECT_EQ(p.strategies[2].strategy, tandem::Strategy::none);
  for (const tandem::StrategyPlan& s : p.strategies) {
    EXPECT_TRUE(s.applicable) << tandem::to_string(s.strategy);
    EXPECT_TRUE(s.fits) << tandem::to_string(s.strategy);
    EXPECT_GT(s.step_ms, 0);
    EXPECT_GT(s.peak_mem_bytes, 0);
    EXPECT_GE(s.exposed_comm_ms, 0);
    EXPECT_LE(s.exposed_comm_ms, s.step_ms);
    EXPECT_FALSE(s.bottleneck.empty());
  }
  ASSERT_NE(p.best(), nullptr);
  EXPECT_FALSE(p.why.empty());
  EXPECT_FALSE(p.report.empty());
  EXPECT_NE(p.hardware.find("cpu-local"), std::string::npos) << p.hardware;

  // One strategy on other hardware, and memory too small for any.
  r.strategy = tandem::Strategy::hybrid;
  r.shard_group = 1;
  r.hardware = "h200-sxm";
  const tandem::PlanResult h = tandem::plan(r);
  ASSERT_EQ(h.strategies.size(), 1u);
  EXPECT_EQ(h.strategies[0].strategy, tandem::Strategy::hybrid);
  r.mem_GiB = 1e-6;
  const tandem::PlanResult none_fits = tandem::plan(r);
  EXPECT_EQ(none_fits.best(), nullptr);
  EXPECT_FALSE(none_fits.strategies[0].fits);

  r.hardware = "no-such-machine";
  EXPECT_THROW(tandem::plan(r), tandem::Error);
  const std::vector<std::string> hw = tandem::hardware_presets();
  EXPECT_NE(std::find(hw.begin(), hw.end(), "h200-sxm"), hw.end());
}

TEST(Api, TokenizerFromFileAndPrepare) {
  const fs::path vocab = fs::path(TANDEM_TEST_DATA_DIR) / "fixtures/tokenizers/gpt2/vocab.json";
  tandem::Tokenizer bytes = tandem::Tokenizer::bytes();
  EXPECT_EQ(bytes.vocab_size(), 256u);
  EXPECT_EQ(bytes.decode(bytes.encode("\xff"
                                      "a")),
            "\xff"
            "a");
  EXPECT_THROW(tandem::Tokenizer::from_file("/no/such/tokenizer.json"), tandem::Error);
  tandem::Tokenizer tok = tandem::Tokenizer::bytes();
  try {
    tok = tandem::Tokenizer::from_file(vocab);
  } catch (const tandem::Error& e) {
    GTEST_SKIP() << e.what();  // a build without PCRE2
  }
  EXPECT_EQ(tok.kind(), "GPT-2 BPE");
  EXPECT_EQ(tok.vocab_size(), 50257u);
  EXPECT_EQ(tok.eos_id(), 50256u);
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
  EXPECT_EQ(tok.decode({15496, 995, 50256}, true), "Hello world");
  EXPECT_EQ(tok.token_to_id("Hello"), 15496u);
  EXPECT_THROW(tok.decode({60000}), tandem::Error);
  TempDir dir;
  std::ofstream(dir.path / "a.txt") << "Hello world";
  std::ofstream(dir.path / "b.txt") << "Hello";
  const tandem::PrepareReport r = tandem::prepare_text_files(
      {dir.path / "a.txt", dir.path / "b.txt"}, dir.path / "d.tok", tok, 2);
  EXPECT_EQ(r.tokens, 4u);  // Hello world <|endoftext|> Hello
}

TEST(Api, TrainConfigJsonRoundTripsAndChecksAsTheCommand) {
  const tandem::TrainConfig c = tandem::train_config_from_json(
      R"({"model": "gpt2-tiny", "data": "d.tok", "global-batch": 8, "lr": 0.001,
          "strategy": "grad-op", "mem-limit": "1GiB", "progress": "lines",
          "recompute": "attention", "recompute-blocks": 3, "loss-chunk": 256,
          "reduce-dtype": "bf16"})");
  EXPECT_EQ(c.global_batch, 8);
  EXPECT_EQ(c.optimizer.lr, 0.001f);
  EXPECT_EQ(c.strategy, tandem::Strategy::grad_op);
  EXPECT_EQ(c.mem_limit_bytes, uint64_t{1} << 30);
  EXPECT_EQ(c.progress, tandem::Progress::lines);
  EXPECT_EQ(c.recompute, tandem::Recompute::attention);
  EXPECT_EQ(c.recompute_blocks, 3);
  EXPECT_EQ(c.loss_chunk, 256);
  EXPECT_EQ(c.reduce_dtype, tandem::ReduceDtype::bf16);
  EXPECT_EQ(c.batch, tandem::TrainConfig{}.batch);  // absent: the default
  const tandem::TrainConfig again = tandem::train_config_from_json(tandem::train_config_to_json(c));
  EXPECT_EQ(tandem::train_config_to_json(again), tandem::train_config_to_json(c));
  const auto message_of = [](const std::string& json) {
    try {
      tandem::train_config_from_json(json);
    } catch (const tandem::Error& e) {
      return e.message();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message_of(R"({"lr": 20})"), "--lr must be in (0, 10), got 20");
  EXPECT_EQ(message_of(R"({"bogus": 1})"), "unknown training option 'bogus'");
  EXPECT_EQ(message_of(R"({"recompute": "blocks"})"),
            "--recompute must be none, attention or unit, got 'blocks'");
  EXPECT_EQ(message_of(R"({"recompute-blocks": 3})"),
            "--recompute-blocks 3 says how many blocks recompute: it needs --recompute attention "
            "or unit");
  const tandem::TrainConfig chosen =
      tandem::train_config_from_json(R"({"recompute": "unit", "recompute-blocks": "auto"})");
  EXPECT_EQ(chosen.recompute_blocks, tandem::TrainConfig::kAutoRecomputeBlocks);
  EXPECT_NE(tandem::train_config_to_json(chosen).find(R"("recompute-blocks":"auto")"),
            std::string::npos)
      << tandem::train_config_to_json(chosen);
  EXPECT_EQ(message_of(R"({"recompute": "unit", "recompute-blocks": "most"})"),
            "option 'recompute-blocks' must be a number of blocks or \"auto\", got \"most\"");
  EXPECT_EQ(message_of(R"({"recompute": "unit", "recompute-blocks": -1})"),
            "--recompute-blocks must not be negative (0: every block; auto: the fewest that fit), "
            "got -1");
  EXPECT_EQ(message_of(R"({"reduce-dtype": "f16"})"),
            "--reduce-dtype must be f32 or bf16, got 'f16'");
  EXPECT_EQ(message_of(R"({"cuda-graph": true})"),
            "--cuda-graph captures the step as a CUDA graph: it needs --device cuda");
  const tandem::TrainConfig graph =
      tandem::train_config_from_json(R"({"device": "cuda", "cuda-graph": true})");
  EXPECT_EQ(graph.cuda_graph, tandem::CudaGraph::on);
  EXPECT_EQ(tandem::TrainConfig{}.cuda_graph, tandem::CudaGraph::automatic);
  EXPECT_EQ(tandem::train_config_from_json(tandem::train_config_to_json(graph)).cuda_graph,
            tandem::CudaGraph::on);
  EXPECT_EQ(tandem::train_config_from_json(R"({"cuda-graph": "off"})").cuda_graph,
            tandem::CudaGraph::off);
  EXPECT_EQ(tandem::to_string(tandem::CudaGraph::automatic), "auto");
  EXPECT_EQ(message_of(R"({"cuda-graph": "maybe"})"),
            "--cuda-graph must be auto, on or off, got 'maybe'");
  EXPECT_NE(message_of(R"({"hardware": "h200-sxm"})").find("tandem::plan"), std::string::npos);
  EXPECT_NE(message_of("{not json").find("not JSON"), std::string::npos);
}

TEST(Api, ModelGeneratesScoresAndViewsItsWeights) {
  TempDir dir;
  tandem::TrainConfig config = tiny_config(write_data(dir), 2);
  config.save_dir = dir.path / "ckpt";
  tandem::Trainer(config).run();
  tandem::LoadOptions o;
  o.batch = 2;
  o.max_seq = 32;
  tandem::Model model = tandem::Model::load(dir.path / "ckpt", o);
  ASSERT_TRUE(model.tokenizer().has_value());
  EXPECT_EQ(model.tokenizer()->kind(), "byte");
  tandem::GenerateOptions g;
  g.max_new_tokens = 6;
  g.temperature = 0;
  g.ignore_eos = true;
  const std::vector<uint32_t> prompt = {116, 97, 110};
  const tandem::Generation out = model.generate({prompt, {100}}, g);
  ASSERT_EQ(out.ids.size(), 2u);
  ASSERT_EQ(out.ids[0].size(), 6u);
  EXPECT_EQ(out.text[0], model.tokenizer()->decode(out.ids[0]));
  // The logits of every position: greedy's first new token is the last row's argmax.
  const std::vector<float> logits = model.logits(prompt);
  const size_t V = static_cast<size_t>(model.info().vocab);
  ASSERT_EQ(logits.size(), prompt.size() * V);
  const auto last = logits.begin() + static_cast<std::ptrdiff_t>((prompt.size() - 1) * V);
  EXPECT_EQ(
      static_cast<uint32_t>(std::max_element(last, last + static_cast<std::ptrdiff_t>(V)) - last),
      out.ids[0][0]);
  // The final norm's weights, zeroed through the view, zero every logit.
  bool found = false;
  for (const tandem::ParameterView& p : model.parameters()) {
    if (p.name != "transformer.ln_f.weight" && p.name != "transformer.ln_f.bias") continue;
    ASSERT_TRUE(p.writable);
    ASSERT_EQ(p.shape.size(), 1u);
    for (int64_t i = 0; i < p.shape[0]; ++i) p.data[i * p.strides[0]] = 0;
    found = true;
  }
  ASSERT_TRUE(found);
  for (float v : model.logits(prompt)) ASSERT_EQ(v, 0.0f);
}
