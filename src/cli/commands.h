// The subcommands of the tandem CLI; each registers its flags and its callback.
#pragma once

#include <CLI/CLI.hpp>

#include "api/environment.h"

namespace tandem {

// Thrown by a command that ends on purpose with a nonzero status (an interrupted run):
// main finishes the process normally with this code, printing nothing more.
struct CommandExit {
  int code = 0;
};

// train and probe run ranks: they take the launcher, the terminal and the attention
// setting from the process environment, read once by main.
void cli_add_train(CLI::App& app, const Environment& env);
void cli_add_generate(CLI::App& app, const Environment& env);
void cli_add_data(CLI::App& app, const Environment& env);
void cli_add_tokenize(CLI::App& app);
void cli_add_export(CLI::App& app);
// plan takes TANDEM_FLASH_BACKWARD, to say when a compute file measured another form.
void cli_add_plan(CLI::App& app, const Environment& env);
void cli_add_models(CLI::App& app);
void cli_add_probe(CLI::App& app, const Environment& env);
void cli_add_trace(CLI::App& app);
void cli_add_report(CLI::App& app);

}  // namespace tandem
