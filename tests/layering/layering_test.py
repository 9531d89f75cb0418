#!/usr/bin/env python3
"""The include graph of the tree against the layering of docs/DESIGN.md §4 (label cpu).

Every `#include "..."` of a project file (headers, sources, .cu, header-only includes too) is read; a file
belongs to a module by its path (MODULE_OF); a module may include only itself and the modules below it in
ALLOWED (transitively). The test fails, naming file, line and the broken rule, on:
  - an include of a module that is not below the including module,
  - a direct include the design rules out (FORBIDDEN_DIRECT),
  - an include of a project path that does not exist (no forwarding headers are left at old paths),
  - a cycle in ALLOWED itself.
Usage: layering_test.py SOURCE_DIR
"""
import pathlib
import re
import sys

# Direct edges of the design's DAG (docs/DESIGN.md §4); a module may use everything reachable from it.
ALLOWED = {
    "common": [],
    "trace": ["common"],
    "signature": ["trace"],
    "placement": ["common"],
    "calib": ["signature", "placement"],
    "model_config": ["trace"],
    "cost": ["model_config"],
    "router": ["calib", "cost"],
    "eval": ["router", "placement"],
    "kvcache": ["common"],
    "kernels": ["common"],
    "model": ["model_config", "kernels", "kvcache"],
    "comm": ["common"],
    "job": ["router", "cost", "model_config"],
    "serve": ["job", "model", "comm"],
    "sim": ["job", "kvcache"],
    "cli": ["serve", "sim", "eval"],
}

# Direct includes the design rules out even where the module is reachable: the router decides online from the
# calibration and never plans placements (the offline replays that need both live in eval/); the simulator
# shares the job module with serve, never serve itself.
FORBIDDEN_DIRECT = {("router", "placement"), ("sim", "serve"), ("sim", "comm"), ("sim", "model")}

# Source roots checked. tests/ and bench/ may include anything (they are not part of the layering).
ROOTS = ["runtime", "kernels", "placement"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "placement":
        return "placement"
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "runtime" and len(parts) >= 3:
        if parts[1] == "model" and pathlib.PurePath(parts[2]).stem == "model_config":
            return "model_config"
        return parts[1]
    raise KeyError(path)


def reachable() -> dict:
    closure = {}

    def visit(m, stack):
        if m in stack:
            raise SystemExit(f"layering_test: ALLOWED has a cycle: {' -> '.join(stack + [m])}")
        if m in closure:
            return closure[m]
        out = {m}
        for d in ALLOWED[m]:
            out |= visit(d, stack + [m])
        closure[m] = out
        return out

    for m in ALLOWED:
        visit(m, [])
    return closure


def main() -> int:
    src = pathlib.Path(sys.argv[1]).resolve()
    below = reachable()
    errors, checked = [], 0
    for root in ROOTS:
        for f in sorted((src / root).rglob("*")):
            if f.suffix not in {".h", ".cc", ".cu", ".cuh", ".in"} or not f.is_file():
                continue
            rel = f.relative_to(src).as_posix()
            try:
                mod = module_of(rel)
            except KeyError:
                errors.append(f"{rel}: not in any module of docs/DESIGN.md §4 (add it to MODULE_OF)")
                continue
            if mod not in ALLOWED:
                errors.append(f"{rel}: module '{mod}' is not in the layering (tests/layering/layering_test.py)")
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if not inc.startswith(tuple(r + "/" for r in ROOTS)):
                    continue  # a system/library header, a generated header or a sibling of a .cu
                checked += 1
                if not (src / inc).is_file():
                    errors.append(f"{rel}:{n}: includes {inc}, which does not exist")
                    continue
                target = module_of(inc)
                if (mod, target) in FORBIDDEN_DIRECT:
                    errors.append(f"{rel}:{n}: {mod} includes {inc}: {mod} must not include {target} directly")
                elif target not in below[mod]:
                    errors.append(f"{rel}:{n}: {mod} includes {inc} ({target}), which is not below {mod}")
    for e in errors:
        print(f"FAILED {e}")
    print(f"layering: {checked} project includes checked in {', '.join(ROOTS)}")
    print(f"{0 if errors else 1} passed, {1 if errors else 0} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
