#!/usr/bin/env python3
"""Counts what ModelConfig (src/model/config.h) holds at its top level against what sits in its
per-kind structs, by a brace parse (no C++ parser): comments are blanked, the struct's body is
walked, and each statement at depth 1 is a field (a declaration ending in `;` that is not a
function), a per-kind struct (`struct X { ... } name;`, counted once with its fields), or a
member function (skipped). Issue 29: the top level keeps what every family has.

  scripts/config_fields.py [PATH]   (default src/model/config.h)
"""

import re
import sys


def body_of(text, name):
    start = re.search(r"\bstruct\s+" + name + r"\s*\{", text).end()
    depth, i = 1, start
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start:i - 1]


def statements(body):
    """Depth-1 statements: (text, nested struct body or None)."""
    out, depth, cur, nested_start = [], 0, "", None
    for i, ch in enumerate(body):
        if ch == "{":
            if depth == 0:
                nested_start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and not re.search(r"\bstruct\s+\w+\s*$", cur):
                out.append((cur, None))  # a function body: the statement ends here
                cur = ""
                continue
        if depth == 0 and ch == ";":
            nested = body[nested_start:i] if "struct" in cur and nested_start is not None else None
            out.append((cur, nested))
            cur, nested_start = "", None
        elif depth == 0 and ch != "}":
            cur += ch
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "src/model/config.h"
    text = re.sub(r"//[^\n]*", "", open(path).read())
    fields, kinds = [], []
    for stmt, nested in statements(body_of(text, "ModelConfig")):
        s = " ".join(stmt.split())
        if not s or s.startswith(("public", "private", "using", "static_assert")):
            continue
        m = re.match(r"struct\s+(\w+)\s*(\w+)?$", s)
        if m and not m.group(2):
            continue  # a helper type (SwigluClamp), counted where a kind holds one
        if nested is not None or m:
            member = re.search(r"(\w+)\s*$", s).group(1)
            inner = [x for x, _ in statements(nested[1:] if nested else "") if x.strip() and "(" not in x]
            kinds.append(f"{member} ({len(inner)} fields)")
            continue
        if re.search(r"\)\s*(const)?\s*$", s) or re.search(r"\w+\s*\([^=]*\)\s*(const)?$", s):
            continue  # a member function declaration
        fields.append(re.sub(r"\s*=.*$", "", s).split()[-1])
    print(f"top-level fields: {len(fields)}: {', '.join(fields)}")
    print(f"per-kind structs: {len(kinds)}: {', '.join(kinds)}")


if __name__ == "__main__":
    main()
