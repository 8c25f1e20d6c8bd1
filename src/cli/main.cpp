// tandem: the command-line entry point. Library errors become one line on stderr and a
// nonzero exit here, and nowhere else.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: train and serve GPT- and Llama-family models with sharded data parallelism"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every command");
  tandem::cli_add_train(app);
  tandem::cli_add_generate(app);
  tandem::cli_add_data(app);
  tandem::cli_add_export(app);
  tandem::cli_add_models(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A misspelt command leaves its name unparsed; name it instead of "a subcommand is
    // required".
    std::vector<std::string> rest = app.remaining();
    for (const CLI::App* sub : app.get_subcommands()) {
      std::vector<std::string> r = sub->remaining();
      if (!r.empty()) rest = r;
    }
    if (!rest.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::fprintf(stderr, "tandem: error: unknown command '%s' (see 'tandem --help')\n",
                   rest.front().c_str());
    } else {
      std::fprintf(stderr, "tandem: error: %s (see 'tandem --help')\n", e.what());
    }
    return 2;
  } catch (const tandem::Error& e) {
    const char* verbose = std::getenv("TANDEM_VERBOSE_ERRORS");
    const std::string text = verbose && *verbose ? e.describe() : e.message();
    std::fprintf(stderr, "tandem: error: %s\n", text.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
