"""tools/lsan_tracer_crash.py, which scripts/test.sh asks whether a sanitizer run's failures
were only LeakSanitizer's tracer crashing ([Tracer crash]), on ctest logs written here."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "lsan_tracer_crash.py"

CRASH = ("[  PASSED  ] 85 tests.\n"
         "Tracer caught signal 11: addr=0x40d0 pc=0x7f530f8e80f0 sp=0x7f5309a00d10\n"
         "==9803==LeakSanitizer has encountered a fatal error.\n")


def block(i, name, output, passed):
    return (f"{i}/3 Testing: {name}\n{i}/3 Test: {name}\nCommand: x\n"
            f"\"{name}\" start time: Dec 07 22:08 UTC\nOutput:\n{'-' * 58}\n{output}"
            f"<end of output>\nTest time =   1.00 sec\n{'-' * 58}\n"
            f"Test {'Passed' if passed else 'Failed'}.\n\"{name}\" end time: Dec 07 22:08 UTC\n")


def run(tmp_path, tests):
    """tests: (name, output, passed) in run order; the tool's exit code and message."""
    temp = tmp_path / "Testing" / "Temporary"
    temp.mkdir(parents=True)
    temp.joinpath("LastTest.log").write_text(
        "Start testing\n" + "".join(block(i + 1, *t) for i, t in enumerate(tests)))
    temp.joinpath("LastTestsFailed.log").write_text(
        "".join(f"{i + 1}:{t[0]}\n" for i, t in enumerate(tests) if not t[2]))
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path)], capture_output=True,
                       text=True, check=False)
    return r.returncode, r.stdout


def test_only_the_tracer_crash_is_rerun(tmp_path):
    code, out = run(tmp_path, [("a", "[  PASSED  ] 2 tests.\n", True),
                               ("dist_comm_np4", CRASH, False)])
    assert code == 0, out
    assert "dist_comm_np4" in out


def test_a_real_failure_beside_the_crash_is_not(tmp_path):
    for real in ("[  FAILED  ] Comm.AllGather\n", "x.cpp:3: Failure\n",
                 "==1==ERROR: LeakSanitizer: detected memory leaks\n",
                 "x.cpp:3:5: runtime error: signed integer overflow\n",
                 "==1==ERROR: AddressSanitizer: heap-use-after-free\n"):
        d = tmp_path / str(abs(hash(real)))
        code, out = run(d, [("dist_comm_np4", real + CRASH, False)])
        assert code == 1, (real, out)


def test_a_failure_without_the_crash_is_not(tmp_path):
    code, out = run(tmp_path / "plain", [("a", "[  FAILED  ] A.B\n", False)])
    assert code == 1 and "without" in out, out
    # One crash and one other failure: not only the crash.
    code, out = run(tmp_path / "mixed", [("a", CRASH, False), ("b", "exit 3\n", False)])
    assert code == 1, out


def test_nothing_failed_or_no_logs(tmp_path):
    code, _ = run(tmp_path / "none", [("a", "ok\n", True)])
    assert code == 1
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "missing")],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1
