#!/usr/bin/env python3
"""Checks that tandem's sources include only their own layer and the layers below it.

    tools/check_layers.py SRC_DIR      check the tree under SRC_DIR (the repository's src/)
    tools/check_layers.py --self-test  check the checker on a small fake tree

The layer map (LAYERS below; docs/layers.md has it as a table): every folder directly under
src/ has a layer number, low to high. A file under src/<folder>/ (its cuda/ subfolder and
any other subfolder included) may include, through #include "folder/...", headers of its own
folder and of folders of a strictly lower layer. Folders of the same layer (train and infer)
may not include each other. An include of a folder that is not in the map fails, and so does
a file in a folder that is not in the map: a new folder must be given its place here first.

The process environment is read only at the top: `getenv` (std::getenv, secure_getenv, ...)
may appear only in the folders of ENV_FOLDERS; everywhere else a setting arrives as a typed
option. Comments are not checked, so a comment may name getenv or an include.

Every violation is one line, `src/x/y.cpp:LINE includes "z/w.h" (layer x may not use z)`;
the exit status is 1 if there is any, 0 (with a one-line summary) if there is none, and 2
for a bad command line. Python 3 standard library only.
"""
import os
import re
import shutil
import sys
import tempfile

# The layers, low to high: folder under src/ -> layer number. A folder may use the folders
# of a lower number (and itself); equal numbers may not use each other.
LAYERS = {
    "core": 0,    # tensors, dtypes, the arena planner, errors, RNG, fault points
    "device": 1,  # the Device interface, the CPU and CUDA devices, the kernel tables
    "comm": 2,    # communicators: MPI, one rank, NCCL; the launcher
    "model": 3,   # configs, units, parameters, the composition of forward and backward
    "optim": 4,   # AdamW, clipping, the schedule (uses model)
    "shard": 5,   # flat buffers and shards, the step program, the engine
    "io": 6,      # token files, datasets, safetensors, export, checkpoints
    "train": 7,   # the training loop and its options
    "infer": 7,   # sampling and generation (same layer as train: neither includes the other)
    "plan": 8,    # the cost model, hardware presets, the probes, traces
    "api": 9,     # the library API; reads the process environment
    "cli": 10,    # the tandem command
}

# The only folders whose files may call getenv.
ENV_FOLDERS = ("api", "cli")

SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".inl",
                   ".ipp")

INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)
GETENV_RE = re.compile(r"getenv")
HEX = set("0123456789abcdefABCDEF")


def strip_code(text, strings):
    """text with comments (and, if strings, string and character literals) blanked out,
    newlines kept, so that offsets and line numbers stay those of the file."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                                      or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(blank(text[i:j]) if strings else text[i:j])
            i = j
        elif c == "'" and 0 < i < n - 2 and text[i - 1] in HEX and text[i + 1] in HEX \
                and text[i + 2] != "'":
            out.append(c)  # a digit separator: 1'000'000
            i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(blank(text[i:j]) if strings else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, name)


def check_tree(root):
    """Returns (violations, number of files, number of includes checked)."""
    root = os.path.abspath(root)
    shown_root = os.path.basename(root.rstrip(os.sep)) or root
    violations = []
    files = includes = 0
    for path in source_files(root):
        rel = os.path.relpath(path, root)
        shown = "/".join([shown_root] + rel.split(os.sep))
        parts = rel.split(os.sep)
        folder = parts[0] if len(parts) > 1 else None
        files += 1
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if folder is None:
            violations.append(f"{shown}: a source file outside every layer folder "
                              f"(place it in a folder of the layer map)")
        elif folder not in LAYERS:
            violations.append(f"{shown}: folder {folder} is not in the layer map "
                              f"(add it to LAYERS in tools/check_layers.py and docs/layers.md)")
        code = strip_code(text, strings=False)
        for m in INCLUDE_RE.finditer(code):
            includes += 1
            target = m.group(1)
            line = line_of(code, m.start())
            target_folder = include_folder(root, path, target)
            if target_folder is None or target_folder == folder:
                continue  # beside the including file, or its own folder
            if target_folder not in LAYERS:
                violations.append(f'{shown}:{line} includes "{target}" (folder {target_folder} '
                                  f"is not in the layer map)")
            elif folder in LAYERS and LAYERS[target_folder] >= LAYERS[folder]:
                violations.append(f'{shown}:{line} includes "{target}" '
                                  f"(layer {folder} may not use {target_folder})")
        if folder not in ENV_FOLDERS:
            bare = strip_code(text, strings=True)
            lines = sorted({line_of(bare, m.start()) for m in GETENV_RE.finditer(bare)})
            for line in lines:
                violations.append(f"{shown}:{line} calls getenv "
                                  f"(only {' and '.join(f'src/{e}/' for e in ENV_FOLDERS)} "
                                  f"read the environment)")
    return violations, files, includes


def include_folder(root, path, target):
    """The src/ folder that #include "target" in path names; None for a file of the
    including file's own directory ("x.h", or "cuda/x.h" that lies beside it)."""
    if "/" not in target:
        return None
    beside = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if target.startswith(("./", "../")) or os.path.isfile(beside):
        rel = os.path.relpath(beside, root).split(os.sep)
        if os.path.isfile(beside) and rel[0] != os.pardir and len(rel) > 1:
            same = os.path.relpath(path, root).split(os.sep)[0] == rel[0]
            return None if same else rel[0]
        return rel[0]  # outside src/, or nowhere: not a folder of the map
    return target.split("/")[0]


def self_test():
    """A fake tree with one upward include, one include of an unknown folder, one getenv
    outside api/ and cli/, and legal includes: the checker must report exactly the bad
    three and accept the rest."""
    tmp = tempfile.mkdtemp(prefix="check_layers_")
    try:
        src = os.path.join(tmp, "src")
        files = {
            "core/error.h": "#pragma once\n// getenv is not called here; only named.\n",
            "core/rng.cpp": '#include "core/error.h"\n#include "rng.h"\n',
            "core/rng.h": '#pragma once\n/* #include "cli/flags.h" in a comment is fine */\n',
            "device/cuda/kernels.cu": ('#include "core/error.h"\n#include "device/device.h"\n'
                                       '#include "shard/engine.h"\n'),  # upward: line 3
            "device/device.h": '#pragma once\n#include <vector>\n#include "core/error.h"\n',
            "shard/engine.h": '#pragma once\n#include "device/device.h"\n',
            "train/loop.cpp": ('#include "shard/engine.h"\n\n'
                               'const char* p = std::getenv("X");\n'  # getenv: line 3
                               'const char* s = "getenv in a string";\n'),
            "infer/gen.cpp": '#include "model/config.h"\n#include "tools/x.h"\n',  # line 2
            "cli/main.cpp": '#include "train/loop.h"\nconst char* v = std::getenv("Y");\n',
        }
        for rel, body in files.items():
            p = os.path.join(src, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(body)
        got, nfiles, _ = check_tree(src)
        want = [
            'src/device/cuda/kernels.cu:3 includes "shard/engine.h" (layer device may not use '
            'shard)',
            'src/infer/gen.cpp:2 includes "tools/x.h" (folder tools is not in the layer map)',
            "src/train/loop.cpp:3 calls getenv",
        ]
        ok = len(got) == len(want) and all(
            any(g.startswith(w) for g in got) for w in want) and nfiles == len(files)
        # An unknown folder of the tree itself is caught too.
        os.makedirs(os.path.join(src, "tools"))
        with open(os.path.join(src, "tools", "t.cpp"), "w") as f:
            f.write('#include "core/error.h"\n')
        got2, _, _ = check_tree(src)
        ok = ok and any(g.startswith("src/tools/t.cpp: folder tools is not in the layer map")
                        for g in got2) and len(got2) == len(want) + 1
        if not ok:
            print("check_layers self-test FAILED; expected:", *want, "and src/tools/t.cpp",
                  "got:", *got2, sep="\n  ")
            return 1
        print(f"check_layers self-test OK: caught {len(got2)} violations in a fake tree of "
              f"{nfiles + 1} files")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if len(argv) != 1 or argv[0].startswith("-") or not os.path.isdir(argv[0]):
        print("usage:\n" + __doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    violations, files, includes = check_tree(argv[0])
    for v in violations:
        print(v)
    if violations:
        print(f"check_layers: {len(violations)} violation(s) in {files} files "
              f"(layer map and rules: docs/layers.md)")
        return 1
    print(f"check_layers OK: {files} files, {includes} includes, every one to its own or a "
          f"lower layer; getenv only in {', '.join(f'src/{e}/' for e in ENV_FOLDERS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
