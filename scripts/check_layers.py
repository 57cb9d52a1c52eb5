#!/usr/bin/env python3
"""Checks the engine's layering (docs/design.md, section 1) on every `#include "..."`.

Reads each source and header under src/ and tools/, finds the layer of the including file and
of the header it names, and reports every include the layer table below does not allow, one line
each: `file:line: <layer> includes <layer> (header)`. Exits 1 if there is any, 0 otherwise.

The build runs it (the `check_layers` target in CMakeLists.txt) and so does CTest
(`layers.check`, label unit), so an include that climbs a layer fails both. Today's known
violations are listed in ALLOW_LIST, each with its reason; an entry that no longer matches any
include is itself an error, so the list can only shrink.

  scripts/check_layers.py [--root DIR]   check the tree at DIR (default: this repository)
  scripts/check_layers.py --self-test    check that synthetic violations are reported
                                         (writes no files)

Python 3 standard library only.
"""

import argparse
import os
import re
import sys

# The layer of a directory under src/; tools/ is the layer "tools".
SRC_LAYERS = ("core", "io", "quant", "gguf", "expert_source", "model", "moe", "text", "chat", "engine", "serve",
              "synth", "telemetry")

# Files whose layer is not their directory's (none today: the expert-source interface, which
# sits below both model and moe, has its own directory, src/expert_source).
FILE_LAYERS = {}

# Which layers each layer may include (besides itself). Not transitive: list what is allowed.
ALLOWED = {
    "core": set(),  # the machine: errors, fp16, cpu features, threads, timers
    "telemetry": set(),  # /proc and /sys readings: includes nothing from src/
    "io": {"core"},  # all file access
    "quant": {"core"},  # bytes of blocks: no models, files or threads
    "gguf": {"core", "io", "quant"},  # the file format; of quant only the type table (HEADER_LIMITS)
    "expert_source": {"core", "quant"},  # the interface model consumes and moe implements
    "model": {"core", "quant", "expert_source"},  # the forward pass: experts only through the interface
    "moe": {"core", "io", "quant", "expert_source"},  # expert sources, caches, policies
    "text": {"core"},  # tokenizer, UTF-8, sampling, GBNF grammars
    "chat": {"core", "text"},  # Jinja, chat templates, JSON Schema, tool calls, reply parsing
    # Synthetic models: GGUF writer, quantizers, vocabularies; a model is described by its
    # architecture, so synth sits above model and reads its tensor table (HEADER_LIMITS).
    "synth": {"core", "gguf", "quant", "text", "model"},
    "engine": {"core", "io", "quant", "gguf", "expert_source", "model", "moe", "text", "chat",
               "telemetry"},
    # bmoe-server without HTTP: worker, request parser, responses, event stream.
    "serve": {"core", "io", "quant", "gguf", "expert_source", "model", "moe", "text", "chat", "engine",
              "telemetry"},
    "tools": {"core", "io", "quant", "gguf", "expert_source", "model", "moe", "text", "chat", "engine",
              "serve", "synth", "telemetry"},
}

# Where a layer may include only some headers of another.
HEADER_LIMITS = {
    ("gguf", "quant"): {"quant/types.h"},  # type ids and block geometry, no kernels
    ("synth", "model"): {"model/arch_table.h", "model/arch.h"},  # which tensors a family has
}

# Today's known violations: (including file, included header, why). Fix one, remove its entry;
# never add one to get a build through (move the code to the right layer instead).
ALLOW_LIST = [
]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cc", ".c", ".inc")


def layer_of_file(rel):
    """The layer of a file given relative to the root (forward slashes), or None."""
    if rel in FILE_LAYERS:
        return FILE_LAYERS[rel]
    parts = rel.split("/")
    if parts[0] == "tools":
        return "tools"
    if parts[0] == "src" and len(parts) > 2 and parts[1] in SRC_LAYERS:
        return parts[1]
    return None


def layer_of_header(header, including_rel):
    """The layer of an included header, or None if it names no layer."""
    if "/" not in header:
        # Next to the including file (tools' own headers, generated ones such as web_index.h).
        return layer_of_file(including_rel)
    first = header.split("/")[0]
    if first in SRC_LAYERS:
        return layer_of_file("src/" + header)
    return None


def check(files, allow_list):
    """files: iterable of (relative path, text). Returns the list of violation lines."""
    problems = []
    used = set()
    allowed_pairs = {(f, h) for f, h, _ in allow_list}
    for rel, text in files:
        layer = layer_of_file(rel)
        if layer is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            header = m.group(1)
            target = layer_of_header(header, rel)
            if target is None:
                problems.append(f"{rel}:{lineno}: {layer} includes a header of no layer ({header})")
                continue
            if target == layer:
                continue
            ok = target in ALLOWED[layer]
            limit = HEADER_LIMITS.get((layer, target))
            if ok and limit is not None and header not in limit:
                ok = False
            if ok:
                continue
            if (rel, header) in allowed_pairs:
                used.add((rel, header))
                continue
            problems.append(f"{rel}:{lineno}: {layer} includes {target} ({header})")
    for f, h, _ in allow_list:
        if (f, h) not in used:
            problems.append(f"scripts/check_layers.py: allow-list entry {f} -> {h} matches no "
                            f"violation any more: remove it")
    return problems


def tree_files(root):
    for top in ("src", "tools"):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXTS):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    yield rel, f.read()


def self_test():
    """Synthetic trees (in memory): each climbing include must be reported, nothing else."""
    cases = [
        # (name, files, allow list, expected problem lines)
        ("core includes model",
         [("src/core/a.h", '#include "core/error.h"\n#include "model/transformer.h"\n')], [],
         ["src/core/a.h:2: core includes model (model/transformer.h)"]),
        ("model includes moe beside the interface",
         [("src/model/m.h", '#include "expert_source/expert_source.h"\n#include "quant/weight.h"\n'
                            '  #  include "moe/streaming_experts.h"\n')], [],
         ["src/model/m.h:3: model includes moe (moe/streaming_experts.h)"]),
        ("moe includes model",
         [("src/moe/s.h", '#include "io/read_lanes.h"\n#include "model/transformer.h"\n')], [],
         ["src/moe/s.h:2: moe includes model (model/transformer.h)"]),
        ("the interface includes moe",
         [("src/expert_source/expert_source.h", '#include "quant/weight.h"\n#include "moe/cache_policy.h"\n')], [],
         ["src/expert_source/expert_source.h:2: expert_source includes moe (moe/cache_policy.h)"]),
        ("io includes quant, quant includes io",
         [("src/io/x.cpp", '#include "quant/types.h"\n'), ("src/quant/k.cpp", '#include "io/mapped_file.h"\n')],
         [],
         ["src/io/x.cpp:1: io includes quant (quant/types.h)",
          "src/quant/k.cpp:1: quant includes io (io/mapped_file.h)"]),
        ("gguf may include only quant's type table",
         [("src/gguf/g.cpp", '#include "quant/types.h"\n#include "quant/quant.h"\n')], [],
         ["src/gguf/g.cpp:2: gguf includes quant (quant/quant.h)"]),
        ("synth may read only the architecture table of model",
         [("src/synth/s.cpp", '#include "model/arch_table.h"\n#include "model/transformer.h"\n')], [],
         ["src/synth/s.cpp:2: synth includes model (model/transformer.h)"]),
        ("text includes chat; chat includes the engine",
         [("src/text/t.cpp", '#include "text/utf8.h"\n#include "chat/jinja.h"\n'),
          ("src/chat/c.cpp", '#include "text/tag_scan.h"\n#include "engine/run.h"\n')], [],
         ["src/text/t.cpp:2: text includes chat (chat/jinja.h)",
          "src/chat/c.cpp:2: chat includes engine (engine/run.h)"]),
        ("the engine includes serve",
         [("src/engine/e.cpp", '#include "serve/worker.h"\n'), ("src/serve/w.cpp", '#include "engine/run.h"\n')], [],
         ["src/engine/e.cpp:1: engine includes serve (serve/worker.h)"]),
        ("src includes tools; an unknown directory",
         [("src/engine/e.cpp", '#include "run_options.h"\n#include "tools/run_options.h"\n')], [],
         ["src/engine/e.cpp:2: engine includes a header of no layer (tools/run_options.h)"]),
        ("engine includes tools' header by a relative path",
         [("src/engine/e.cpp", '#include "../../tools/run_options.h"\n')], [],
         ["src/engine/e.cpp:1: engine includes a header of no layer (../../tools/run_options.h)"]),
        ("allowed includes pass",
         [("src/engine/e.cpp", '#include "moe/streaming_experts.h"\n#include "engine/e.h"\n'),
          ("tools/t.cpp", '#include "engine/loader.h"\n#include "web_index.h"\n'),
          ("src/model/t.h", '// #include "moe/cache_policy.h"\n#include "expert_source/expert_source.h"\n'),
          ("src/telemetry/s.cpp", '#include "telemetry/s.h"\n#include <vector>\n')], [],
         []),
        ("an allow-listed violation passes; a stale entry is reported",
         [("src/text/t.cpp", '#include "gguf/gguf.h"\n')],
         [("src/text/t.cpp", "gguf/gguf.h", "test"), ("src/text/u.cpp", "io/mapped_file.h", "test")],
         ["scripts/check_layers.py: allow-list entry src/text/u.cpp -> io/mapped_file.h matches no "
          "violation any more: remove it"]),
    ]
    failed = 0
    for name, files, allow, expected in cases:
        got = check(files, allow)
        if got != expected:
            failed += 1
            print(f"self-test FAILED: {name}\n  expected: {expected}\n  got:      {got}")
    # The real allow list names real files of known layers.
    for f, h, why in ALLOW_LIST:
        if layer_of_file(f) is None or layer_of_header(h, f) is None or not why:
            failed += 1
            print(f"self-test FAILED: allow-list entry {f} -> {h} names no layer or gives no reason")
    if failed:
        return 1
    print(f"check_layers self-test: {len(cases)} cases passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="repository root (default: this script's repository)")
    parser.add_argument("--self-test", action="store_true",
                        help="check that synthetic climbing includes are reported")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(tree_files(args.root), ALLOW_LIST)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the layering (docs/design.md, section 1)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
