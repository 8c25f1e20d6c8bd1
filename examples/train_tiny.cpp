// Trains tandem's tiny byte-level GPT (preset gpt2-tiny) for a few steps on the CPU through
// the public API, printing each step's loss, and exits nonzero unless the loss fell.
//
//   train_tiny [TOKEN_FILE [STEPS]]
//
// Without a token file it writes one, train_tiny.tok in the current directory, from a few
// repeated sentences.
#include <tandem/tandem.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

namespace {

// Returns the exit status: 0 when the loss fell.
int train(const std::filesystem::path& given_data, int steps) {
  std::filesystem::path data = given_data;
  if (data.empty()) {
    std::string text;
    for (int i = 0; i < 100; ++i)
      text +=
          "A step is a program, built once and replayed. Communication hides behind "
          "compute. Every step reports how much of it was exposed.\n";
    data = "train_tiny.tok";
    tandem::write_token_file(data, tandem::byte_tokens(text));
  }

  const tandem::ModelInfo model = tandem::load_model_info("gpt2-tiny");
  std::printf("%s: %s family, %d layers of width %d, %.2fM parameters\n", model.name.c_str(),
              std::string(tandem::to_string(model.family)).c_str(), model.n_layer, model.d_model,
              static_cast<double>(model.num_params) / 1e6);

  tandem::TrainConfig config;
  config.model = "gpt2-tiny";
  config.data = data;
  config.device = tandem::Device::cpu;
  config.batch = 4;
  config.seq = 64;
  config.steps = steps;
  config.optimizer.lr = 2e-3f;

  tandem::Trainer trainer(config);
  double first_loss = 0;
  const tandem::StepMetrics last = trainer.run([&](const tandem::StepMetrics& m) {
    if (m.step == 1) first_loss = m.loss;
    std::printf("step %3lld  loss %.4f  lr %.2e  %6.0f tokens/s\n", static_cast<long long>(m.step),
                m.loss, static_cast<double>(m.lr), m.tokens_per_s);
  });

  if (!(last.loss < first_loss)) {
    std::fprintf(stderr, "train_tiny: the loss did not fall (%.4f at step 1, %.4f at step %lld)\n",
                 first_loss, last.loss, static_cast<long long>(last.step));
    return 1;
  }
  std::printf("the loss fell from %.4f to %.4f in %lld steps\n", first_loss, last.loss,
              static_cast<long long>(last.step));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int status = train(argc > 1 ? argv[1] : "", argc > 2 ? std::stoi(argv[2]) : 12);
    tandem::finalize();  // after the Trainer is gone: ends this rank's part of an MPI job
    return status;
  } catch (const std::exception& e) {  // tandem::Error is a std::runtime_error
    std::fprintf(stderr, "train_tiny: %s\n", e.what());
    return 1;
  }
}
