#!/usr/bin/env python3
"""Reports import cycles between the top-level modules of controller/src.

For each top-level module (a file `x.rs` or a directory `x/` beside main.rs) it collects the
other top-level modules it names through `crate::y` (in `use` lines or paths), ignoring test-only
files (`tests.rs`, `*_tests.rs`, `testkit.rs`) and `#[cfg(test)] mod tests` blocks at the end of a
file. Exits 1 and prints each strongly connected component of more than one module when there is
a cycle. Usage: scripts/module_cycles.py [controller/src]
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "controller", "src")
TEST_FILE = re.compile(r"(^|/)(tests|[a-z_]+_tests|testkit)\.rs$")


def top_modules():
    mods = {}
    for name in os.listdir(ROOT):
        path = os.path.join(ROOT, name)
        if name.endswith(".rs") and name != "main.rs":
            mods.setdefault(name[:-3], []).append(path)
        elif os.path.isdir(path):
            for d, _, files in os.walk(path):
                for f in files:
                    if f.endswith(".rs"):
                        mods.setdefault(name, []).append(os.path.join(d, f))
    return {m: [p for p in ps if not TEST_FILE.search(os.path.relpath(p, ROOT))] for m, ps in mods.items()}


def strip_tests(text):
    # drop a trailing `#[cfg(test)] mod tests { ... }` block (the convention in this crate)
    m = re.search(r"\n#\[cfg\(test\)\]\s*\nmod tests\s*\{", text)
    return text[: m.start()] if m else text


def references(paths, names):
    found = set()
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = strip_tests(f.read())
        text = re.sub(r"//[^\n]*", "", text)
        for m in re.finditer(r"crate::([a-z_][a-z0-9_]*)", text):
            found.add(m.group(1))
        for m in re.finditer(r"use crate::\{([^;]*)\}", text, re.S):
            for part in re.findall(r"(?:^|[,{]\s*)([a-z_][a-z0-9_]*)", m.group(1)):
                found.add(part)
    return {n for n in found if n in names}


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    sys.setrecursionlimit(10000)
    mods = top_modules()
    graph = {m: sorted(references(ps, mods) - {m}) for m, ps in mods.items()}
    if "-v" in sys.argv:
        for m in sorted(graph):
            print(f"{m} -> {', '.join(graph[m])}")
    cycles = [c for c in sccs(graph) if len(c) > 1]
    for c in cycles:
        print("cycle:", " ".join(c))
        for m in c:
            print(f"  {m} -> {', '.join(x for x in graph[m] if x in c)}")
    if not cycles:
        print("no import cycle between the top-level modules of", os.path.normpath(ROOT))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
