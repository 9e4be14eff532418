#!/usr/bin/env python3
"""Fails (exit 1) when an #include points against the layers of ../shared/DESIGN.md.

Each source folder is a layer and may include only the layers listed for it, plus standard
and system headers (<...>). Public headers (include/ferry/*.h) belong to the layer that
implements them. Run by the build before anything compiles: python3 scripts/check-layers.py ROOT
"""
import os
import re
import sys

# Public headers -> the layer that implements them.
PUBLIC = {
    "ferry/status.h": "core", "ferry/types.h": "core", "ferry/tensor.h": "core",
    "ferry/checked.h": "core",
    "ferry/ops.def": "core", "ferry/graph.h": "core",
    "ferry/backend.h": "backend", "ferry/allocator.h": "backend", "ferry/scheduler.h": "backend",
    "ferry/backends.h": "backends",
    "ferry/remote.h": "remote-client",
    "ferry/server.h": "server",
    "ferry/gguf.h": "model", "ferry/llama.h": "model", "ferry/vocab.h": "model",
    "ferry/sampler.h": "model", "ferry/gen-model.h": "model", "ferry/chat.h": "model",
    "ferry/convert.h": "model",
    "ferry/op-tests.h": "testing",
}
# Private header folders (under src/) -> layer.
PRIVATE = {
    "core/": "core", "backend/": "backend", "backends/cpu/": "cpu",
    "backends/cuda/": "cuda", "backends/openvino/": "openvino",
    "remote-proto/": "remote-proto", "backends/remote/": "remote-client",
    "server/": "server", "model/": "model", "testing/": "testing",
}
# What each layer may include (besides itself).
BELOW = {
    "core": [],
    "backend": ["core"],
    "cpu": ["core", "backend"],
    "cuda": ["core", "backend"],
    "openvino": ["core", "backend"],
    "remote-proto": ["core"],
    "remote-client": ["core", "backend", "remote-proto"],
    "server": ["core", "backend", "remote-proto"],
    "backends": ["core", "backend", "cpu", "cuda", "openvino"],
    "model": ["core", "backend"],
    "testing": ["core", "backend"],
    # The command line uses the public API only (include/ferry), and its own headers.
    "tools": ["core", "backend", "backends", "remote-client", "server", "model", "testing"],
}
# Known exceptions, each with its reason; keep this list empty or shrinking.
ALLOWED_PRIVATE_IN_TOOLS: set = set()


def layer_of_file(rel):
    if rel.startswith("include/ferry/"):
        return PUBLIC.get("ferry/" + rel[len("include/ferry/"):])
    if rel.startswith("tools/"):
        return "tools"
    if rel == "src/backends/backends.cpp":
        return "backends"
    for prefix, layer in PRIVATE.items():
        if rel.startswith("src/" + prefix):
            return layer
    return None


def main(root):
    errors = []
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    for top in ("src", "include", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".h", ".cpp", ".cu", ".cuh", ".def")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                layer = layer_of_file(rel)
                if layer is None:
                    errors.append(f"{rel}: not in any layer (add its folder to scripts/check-layers.py)")
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = inc.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.startswith("ferry/"):
                            tl = PUBLIC.get(target)
                            if tl is None:
                                errors.append(f"{rel}:{n}: public header {target} has no layer")
                                continue
                        elif "/" not in target or target.startswith("../"):
                            continue  # a header beside the file (tools/cli.h, generated)
                        else:
                            tl = None
                            for prefix, l in PRIVATE.items():
                                if target.startswith(prefix):
                                    tl = l
                            if tl is None:
                                errors.append(f"{rel}:{n}: {target} is in no layer")
                                continue
                            if layer == "tools" and target not in ALLOWED_PRIVATE_IN_TOOLS:
                                errors.append(f"{rel}:{n}: the tools include the private header "
                                              f"{target}; use the public API (include/ferry)")
                                continue
                        if tl != layer and tl not in BELOW[layer]:
                            errors.append(f"{rel}:{n}: layer '{layer}' includes {target} "
                                          f"(layer '{tl}'), which is not below it")
    for e in errors:
        print("check-layers: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
