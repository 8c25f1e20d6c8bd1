#!/usr/bin/env python3
"""Whether every test that failed in a ctest run failed only because LeakSanitizer crashed.

  tools/lsan_tracer_crash.py BUILD_DIR

[Tracer crash] LeakSanitizer stops every thread of a process with a tracer thread before it
looks for leaks, and that tracer sometimes crashes with signal 11 on the sanitizer runtime
of g++ 12 (about one 4-rank run of the distributed suite in three on a 2-core VM, every test
of the run passed first, the crash in three of the four ranks at once). The run then fails
with "Tracer caught signal 11" and "LeakSanitizer has encountered a fatal error", without a
leak report: LeakSanitizer never got to look. scripts/test.sh reruns the failed tests once
when this script says that is all that went wrong, and fails otherwise.

Reads ctest's Testing/Temporary/LastTestsFailed.log (the failed tests) and LastTest.log
(each test's output). Exits 0 when there is at least one failed test and each one's output
holds the tracer crash and nothing else that fails a test: no GoogleTest failure, no
sanitizer error report, no leak report, no timeout. Exits 1 otherwise, saying why.
"""

import pathlib
import re
import sys

CRASH = ("Tracer caught signal", "LeakSanitizer has encountered a fatal error")
# Anything here is a real failure, whatever else the output holds.
REAL = (
    "[  FAILED  ]",
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer: detected memory leaks",
    "runtime error:",
    "WARNING: ThreadSanitizer",
    ": Failure\n",
    "***Timeout",
)


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    temp = pathlib.Path(argv[1]) / "Testing" / "Temporary"
    failed_log, last_log = temp / "LastTestsFailed.log", temp / "LastTest.log"
    if not failed_log.is_file() or not last_log.is_file():
        print(f"lsan_tracer_crash: no ctest logs in {temp}")
        return 1
    failed = [line.split(":", 1)[1].strip() for line in failed_log.read_text().splitlines()
              if ":" in line]
    if not failed:
        print("lsan_tracer_crash: no failed tests listed")
        return 1
    text = last_log.read_text(errors="replace")
    # Each test's block starts with "N/M Testing: NAME" and ends with '"NAME" end time:'.
    blocks = {}
    for m in re.finditer(r"^\d+/\d+ Testing: (.+?)\n(.*?)^\"\1\" end time:", text,
                         re.MULTILINE | re.DOTALL):
        blocks[m.group(1).strip()] = m.group(2)
    for name in failed:
        out = blocks.get(name)
        if out is None:
            print(f"lsan_tracer_crash: {name} failed and its output is not in {last_log}")
            return 1
        if not all(c in out for c in CRASH):
            print(f"lsan_tracer_crash: {name} failed without LeakSanitizer's tracer crash")
            return 1
        real = [r.strip() for r in REAL if r in out]
        if real:
            print(f"lsan_tracer_crash: {name} failed for more than the tracer crash "
                  f"({', '.join(real)})")
            return 1
    print(f"lsan_tracer_crash: {len(failed)} test(s) failed only by LeakSanitizer's tracer "
          f"crash: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
