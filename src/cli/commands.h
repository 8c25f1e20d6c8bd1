// The subcommands of the tandem CLI; each registers its flags and its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem {

void cli_add_train(CLI::App& app);
void cli_add_generate(CLI::App& app);
void cli_add_data(CLI::App& app);
void cli_add_export(CLI::App& app);
void cli_add_plan(CLI::App& app);
void cli_add_models(CLI::App& app);
void cli_add_probe(CLI::App& app);

}  // namespace tandem
