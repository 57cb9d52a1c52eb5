#!/usr/bin/env python3
"""Lists the functions under src/ and tools/ longer than the house limit of 60 lines.

The rule (README, "Contributing"; docs/design.md): no function over 60 lines outside the
kernels. This finds function definitions by brace matching, without a C++ parser: comments,
string and character literals and preprocessor lines are blanked first, then each `{` met at
namespace or class scope is classified by the text before it (the "head"): a head ending in
`)` (optionally `const`, `noexcept`, `override`, `-> T`, or a constructor's initialiser list)
opens a function; `namespace`, `struct`, `class`, `union` and `extern "C"` open a scope that is
searched further; anything else (an enum, a braced initialiser) is skipped whole. A lambda
inside a function counts toward that function. Length = the lines from the head's first line to
the closing brace, both included.

  scripts/function_lengths.py [--root DIR] [--limit N] [--all]
      print `path:line: name N lines` for each function over the limit (default 60), longest
      first; files that are kernels (KERNEL_FILES) are left out unless --all
  scripts/function_lengths.py --check
      exit 1 if a function over 60 lines is not in ALLOW_LIST (CTest `style.function_length`);
      an entry that no longer matches a long function is printed as a note to remove it
  scripts/function_lengths.py --self-test
      check the scanner on synthetic sources (writes no files)

Python 3 standard library only.
"""

import argparse
import os
import re
import sys

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cc", ".c", ".inc")

# The kernels: SIMD and reference block kernels, where one long function per block type and
# instruction set is the clearer form (unrolled loads, tile frames). Paths match by prefix.
KERNEL_FILES = (
    "src/quant/quant_",
    "src/quant/float_",
    "src/quant/ref_kernels.h",
    "src/quant/simd_kernels.h",
    "src/quant/neon_shared.h",
    "src/quant/x86_shared.h",
    "src/quant/x86_tiles.h",
    "src/quant/tile_frame.h",
    "src/quant/quant_avx2_tiles_kernels.h",
    "src/quant/quant_avx512_kernels.h",
)

# Known long functions outside the kernels: (path, function name, why it is here). Split one,
# remove its entry; never add one to get a test through (split the function instead).
ALLOW_LIST = [
    ("src/model/attention.cpp", "attend_tile",
     "the SIMD attention tile (scores, online softmax, values for a tile of rows): a kernel in all but its file"),
    ("src/quant/dispatch.cpp", "avx2_table",
     "one add() per block type and instruction set: a table, split only with the kernels' own work (issue 35)"),
]

SCOPE_HEAD_RE = re.compile(r'^(?:template\s*<.*>\s*)?(?:inline\s+)?(namespace\b|extern\s*"C"|'
                           r'(?:struct|class|union)\b)', re.S)
CONTROL_RE = re.compile(r'^(if|for|while|switch|catch|do|else|return|case)\b')
FUNC_TAIL_RE = re.compile(r'\)\s*(?:const\s*|noexcept(?:\s*\([^()]*\))?\s*|override\s*|final\s*|'
                          r'mutable\s*|&{1,2}\s*)*(?:->\s*[^{};=]+)?$', re.S)
CTOR_INIT_RE = re.compile(r'\)\s*(?:noexcept\s*)?:\s*[A-Za-z_]', re.S)


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#" or (at_line_start and c in " \t" and text[i:].lstrip(" \t")[:1] == "#"):
            # A preprocessor line, with its backslash continuations.
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if text[j:k].rstrip().endswith("\\") and k < n:
                    j = k + 1
                    continue
                break
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k < 0 else k
            out.append(" " * (k - i))
            i = k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
            continue
        m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:i + 20]) if c == "R" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = text.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                out.append(c)  # a digit separator (1'000'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
            continue
        out.append(c)
        at_line_start = c == "\n" or (at_line_start and c in " \t")
        i += 1
    return "".join(out)


def match_brace(text, i):
    """Index of the `}` closing the `{` at i (or len(text))."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(text)


def function_name(head):
    """The qualified name before the parameter list of a function head."""
    init = re.search(r"\)\s*(?:noexcept\s*)?:(?!:)", head)
    if init:
        head = head[:init.start() + 1]  # drop a constructor's initialiser list
    close = head.rfind(")")
    depth = 0
    for j in range(close, -1, -1):
        if head[j] == ")":
            depth += 1
        elif head[j] == "(":
            depth -= 1
            if depth == 0:
                m = re.search(r"((?:[\w~]+::)*(?:operator\s*[^\s(]+|operator\(\)|~?\w+))\s*$", head[:j])
                return m.group(1) if m else "?"
    return "?"


def scan(text):
    """Yields (first line, last line, name) for each function definition in C++ text."""
    code = blank(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    line_of.append(line)
    yield from scan_scope(code, 0, len(code), line_of)


def scan_scope(code, begin, end, line_of):
    head_start = begin
    i = begin
    while i < end:
        ch = code[i]
        if ch in ";}":
            head_start = i + 1
            i += 1
            continue
        if ch != "{":
            i += 1
            continue
        head = code[head_start:i].strip()
        close = match_brace(code, i)
        if SCOPE_HEAD_RE.match(head) and "(" not in head.split("{")[0].split("=")[0]:
            yield from scan_scope(code, i + 1, close, line_of)
            head_start = close + 1
            i = close + 1
            continue
        if CTOR_INIT_RE.search(head) and re.search(r"[\w>]\s*$", head):
            i = close + 1  # a member's braced initialiser inside a constructor's list
            continue
        if head and not CONTROL_RE.match(head) and FUNC_TAIL_RE.search(head) or CTOR_INIT_RE.search(head):
            first = head_start + (len(code[head_start:i]) - len(code[head_start:i].lstrip()))
            yield line_of[first], line_of[min(close, len(code) - 1)], function_name(head)
        head_start = close + 1
        i = close + 1


def is_kernel(rel):
    return rel.startswith(KERNEL_FILES)


def tree_files(root, tops=("src", "tools")):
    for top in tops:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_EXTS):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, root).replace(os.sep, "/")
                    with open(path, encoding="utf-8", errors="replace") as f:
                        yield rel, f.read()


def long_functions(files, limit, with_kernels=False):
    found = []
    for rel, text in files:
        if is_kernel(rel) and not with_kernels:
            continue
        for first, last, name in scan(text):
            if last - first + 1 > limit:
                found.append((rel, first, name, last - first + 1))
    found.sort(key=lambda f: (-f[3], f[0], f[1]))
    return found


def check(found, allow_list):
    """(problems, notes): long functions not allowed; allow-list entries no longer long."""
    allowed = {(f, n) for f, n, _ in allow_list}
    problems = [f"{rel}:{line}: {name} is {n} lines (limit 60): split it"
                for rel, line, name, n in found if (rel, name) not in allowed]
    present = {(rel, name) for rel, _, name, _ in found}
    # A note, not a failure: the entry's function may have been split on another branch.
    notes = [f"note: scripts/function_lengths.py: allow-list entry {f} {n} is no longer long: remove it"
             for f, n, _ in allow_list if (f, n) not in present]
    return problems, notes


def self_test():
    body = "\n".join(f"    x += {k};" for k in range(60))
    cases = [
        ("a long free function", f"int f(int x) {{\n{body}\n    return x;\n}}\n", [("f", 63)]),
        ("a short one", "int g() { return 1; }\n", []),
        ("a long member in a class, a short one beside it",
         f"namespace n {{\nstruct S {{\n  int a() const {{ return 1; }}\n  int b(int x) const noexcept {{\n{body}\n"
         f"  return x; }}\n}};\n}}\n", [("b", 62)]),
        ("a constructor with braced member initialisers",
         f"S::S(int v)\n    : a_{{v}}, b_(v) {{\n{body}\n}}\n", [("S::S", 63)]),
        ("an enum and an initialiser table are not functions",
         "enum class E {\n" + ",\n".join(f"  e{k}" for k in range(70)) + "\n};\n"
         "const int kTable[] = {\n" + ",\n".join(str(k) for k in range(70)) + "\n};\n", []),
        ("braces in comments and strings do not count",
         f"int h(int x) {{\n  // {{ not a brace\n  const char* s = \"}}\";\n{body}\n  return x;\n}}\n",
         [("h", 65)]),
        ("a trailing return type and a lambda inside",
         f"auto k(int x) -> int {{\n  auto l = [&](int y) {{ return y; }};\n{body}\n  return l(x);\n}}\n",
         [("k", 64)]),
    ]
    failed = 0
    problems, notes = check([("src/a.cpp", 3, "f", 70), ("src/b.cpp", 9, "g", 61)],
                            [("src/a.cpp", "f", "test"), ("src/c.cpp", "h", "test")])
    if problems != ["src/b.cpp:9: g is 61 lines (limit 60): split it"] or len(notes) != 1 or "src/c.cpp h" not in notes[0]:
        failed += 1
        print(f"self-test FAILED: check() with an allowed, a new and a stale entry: {problems} {notes}")
    for name, src, expected in cases:
        got = [(n, last - first + 1) for first, last, n in scan(src) if last - first + 1 > 60]
        if got != expected:
            failed += 1
            print(f"self-test FAILED: {name}\n  expected: {expected}\n  got:      {got}")
    if failed:
        return 1
    print(f"function_lengths self-test: {len(cases)} cases passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--all", action="store_true", help="include the kernel files")
    parser.add_argument("--check", action="store_true", help="fail on a long function not allow-listed")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.check:
        problems, notes = check(long_functions(tree_files(args.root), 60), ALLOW_LIST)
        for line in notes + problems:
            print(line)
        if problems:
            print(f"function_lengths: {len(problems)} function(s) over 60 lines outside the kernels", file=sys.stderr)
        return 1 if problems else 0
    found = long_functions(tree_files(args.root), args.limit, args.all)
    for rel, line, name, n in found:
        print(f"{rel}:{line}: {name} {n} lines")
    print(f"{len(found)} function(s) over {args.limit} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
