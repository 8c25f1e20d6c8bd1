// tandem: the command-line entry point. Library errors become one line on stderr and a
// nonzero exit here, and nowhere else.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "api/environment.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/fault.h"

namespace {

// `tandem train|probe --ranks N` outside an MPI launcher starts N local ranks through mpirun.
bool wants_local_launch(int argc, char** argv, const tandem::LaunchEnvironment& launch,
                        int* ranks) {
  const std::string command = argc >= 2 ? argv[1] : "";
  if ((command != "train" && command != "probe" && command != "generate") || launch.mpi)
    return false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    if (a == "--ranks" && i + 1 < argc) value = argv[i + 1];
    if (a.rfind("--ranks=", 0) == 0) value = a.substr(8);
    if (value.empty()) continue;
    try {
      *ranks = std::stoi(value);
    } catch (const std::exception&) {
      return false;  // the parser reports the bad value
    }
    return *ranks > 1;
  }
  return false;
}

// One line per error; under MPI (mpi: this process is a rank of an MPI job) it names the
// rank, and the whole job ends with it. A rank of the local launcher (launcher_dir set)
// leaves its line in that directory instead, for the launcher to print once mpirun and its
// own messages are done, so tandem's line is the last one a user sees.
[[noreturn]] void fail(const std::string& message, int code, bool mpi,
                       const std::string& launcher_dir = "") {
  if (mpi) {
    const std::string line =
        fmt::format("tandem: error: [rank {}] {}\n", tandem::error_rank(), message);
    bool left = false;
    if (!launcher_dir.empty()) {
      std::ofstream out(fmt::format("{}/rank-{}.err", launcher_dir, tandem::error_rank()));
      out << line;
      out.flush();
      left = out.good();
    }
    if (!left) {
      std::fputs(line.c_str(), stderr);
      std::fflush(stderr);
    }
    tandem::comm_abort(code);
  }
  std::fprintf(stderr, "tandem: error: %s\n", message.c_str());
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  // The environment is read here, once; the layers below get typed settings from it.
  tandem::Environment env;
  try {
    env = tandem::environment_from_process();
  } catch (const tandem::Error& e) {
    fail(e.message(), 1, false);
  }
  tandem::fault_configure(env.fault);
  const bool mpi = env.launch.mpi;
  int ranks = 0;
  if (wants_local_launch(argc, argv, env.launch, &ranks)) {
    // Ranks see mpirun's pipes, not this terminal: tell them whether progress may redraw a
    // bar. (The launcher also shares the cores between the ranks.)
    setenv("TANDEM_STDOUT_IS_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
    try {
      return tandem::launch_local_ranks(ranks, tandem::launch_strip_ranks(argc, argv), env.launch);
    } catch (const tandem::Error& e) {
      fail(e.message(), 1, mpi);
    }
  }
  CLI::App app{
      "tandem: train and serve GPT- and Llama-family models with sharded data parallelism"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every command");
  tandem::cli_add_train(app, env);
  tandem::cli_add_generate(app, env);
  tandem::cli_add_data(app, env);
  tandem::cli_add_tokenize(app);
  tandem::cli_add_export(app);
  tandem::cli_add_plan(app, env);
  tandem::cli_add_models(app);
  tandem::cli_add_probe(app, env);
  tandem::cli_add_trace(app);
  tandem::cli_add_report(app);
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
  } catch (const tandem::CommandExit& e) {
    tandem::comm_finalize();
    return e.code;
  } catch (const tandem::Error& e) {
    fail(env.verbose_errors ? e.describe() : e.message(), 1, mpi, env.launcher_dir);
  } catch (const std::exception& e) {
    fail(e.what(), 1, mpi, env.launcher_dir);
  }
  tandem::comm_finalize();
  return 0;
}
