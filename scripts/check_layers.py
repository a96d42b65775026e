#!/usr/bin/env python3
"""Checks that the workspace's modules depend one way, as docs/ARCHITECTURE.md maps them.

usage: scripts/check_layers.py [--root DIR]        (run by `just lint`, so by CI)

Reads the two tables under "## Layers" in docs/ARCHITECTURE.md:
- the kernels crate's modules, lowest first: a module may use only the ones above it;
- the runtime crate's folders, lowest first, each with the layers and crates it may use.
Then, from the `crate::` / `super::` / `self::` paths in the source (`super::super::` and inline
`mod x { ... }` resolved, comments and `#[cfg(test)]` code skipped, test files skipped), it
fails, naming both modules and what one takes from the other, on:
- a cycle between modules of any crate of the workspace;
- a module of the kernels crate using one listed below it;
- a runtime folder using a layer or crate (`burn`, `kernels`) not in its row;
- a table row without its module or folder, or a module or folder missing from the table;
- a lib.rs that declares its modules in another order than its table.
Prints "layers: ok" and exits 0 otherwise. Reads text, not rustc's resolution: a path
written some other way (a glob re-export, a macro) is not seen.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

CRATES = ["kernels/src", "runtime/src", "converter/src", "server/src", "cli/src"]
# Crates whose use by a runtime folder the runtime table controls.
WATCHED_CRATES = {"burn": r"\bburn(?:_flex|_ndarray)?::", "kernels": r"(?<![\w:])kernels::"}


def modules(src):
    """{module path tuple: file} for the crate's files, test files left out."""
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            if rel and rel[0] == "bin":
                continue
            if "tests" in rel or "testing" in rel:
                continue  # a test may import what it likes
            mods[tuple(rel)] = path
    return mods


def code_of(path):
    """The file's text without comments and without its `#[cfg(test)]` items."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        # skip the item: up to its `;` or its balanced `{ ... }`
        j = m.end()
        while j < len(text) and text[j] not in "{;":
            j += 1
        if j < len(text) and text[j] == "{":
            depth, j = 1, j + 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
        i = j + 1
    out.append(text[i:])
    return "".join(out)


def inline_mods(text):
    """(start, end, name) of each inline `mod name { ... }`."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        spans.append((m.end(), i, m.group(1)))
    return spans


def resolve(path, mods):
    while path and path not in mods:
        path = path[:-1]
    return path


def edges(src):
    """{module: {module it uses: names taken}} and each module's code."""
    mods = modules(src)
    out, codes = defaultdict(lambda: defaultdict(set)), {}
    for mod, path in mods.items():
        text = codes[mod] = code_of(path)
        spans = inline_mods(text)
        for m in re.finditer(r"(?<![\w:])(crate|super|self)((?:::\w+)*)(?:::\{([^}]*)\})?", text):
            head, rest, group = m.group(1), [s for s in m.group(2).split("::") if s], m.group(3)
            here = tuple(mod) + tuple(n for a, b, n in spans if a <= m.start() < b)
            base = {"crate": (), "super": here[:-1], "self": here}[head]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            targets = [base + tuple(rest)]
            if group:
                targets = [base + tuple(rest) + tuple(g.strip().split("::")[:1])
                           for g in group.split(",") if g.strip()]
            for t in targets:
                r = resolve(t, mods)
                if r and r != mod and not (mod[: len(r)] == r):  # not itself or an ancestor
                    out[mod][r].add(t[-1] if t else "")
    return mods, out, codes


def cycles(mods, adj):
    index, low, stack, on, found, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, {}):
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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index:
            visit(v)
    return found


def tables(doc):
    """The rows of the first two tables after "## Layers": lists of cells."""
    text = open(doc, encoding="utf-8").read()
    start = text.index("\n## Layers")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)]
    found, rows = [], None
    for line in section.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []
            elif not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows is not None:
            found.append(rows)
            rows = None
    if rows is not None:
        found.append(rows)
    if len(found) < 2:
        sys.exit(f"{doc}: expected two tables under '## Layers' (kernels, runtime)")
    return found[0], found[1]


def names(cell):
    return [n.strip("`/ ") for n in cell.split(",") if n.strip("`/ -—")]


def name(m):
    return "::".join(m) or "crate root"


def lib_order(src):
    """The modules lib.rs declares, in its order (test-only ones left out)."""
    code = code_of(os.path.join(src, "lib.rs"))
    return [m.group(1) for m in re.finditer(r"^(?:pub(?:\([^)]*\))? )?mod (\w+);", code, re.M)]


def check_order(crate, listed, table):
    if listed != table:
        return [f"{crate}/lib.rs declares its modules as {', '.join(listed)}; "
                f"ARCHITECTURE.md's table lists {', '.join(table)}"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    root = parser.parse_args().root
    problems = []

    for crate in CRATES:
        src = os.path.join(root, crate)
        mods, adj, _ = edges(src)
        for comp in cycles(mods, adj):
            problems.append(f"cycle in {crate}: " + ", ".join(name(m) for m in comp))
            for a in comp:
                for b in sorted(adj[a]):
                    if b in comp:
                        problems.append(f"  {name(a)} -> {name(b)}: {', '.join(sorted(adj[a][b]))}")

    kernel_rows, runtime_rows = tables(os.path.join(root, "docs/ARCHITECTURE.md"))

    # The kernels crate: each top-level module uses only the ones listed before it.
    mods, adj, _ = edges(os.path.join(root, "kernels/src"))
    order = [names(row[0])[0] for row in kernel_rows]
    top = {m[0] for m in mods if m}
    for missing in sorted(top - set(order)):
        problems.append(f"kernels/src: module {missing} is not in ARCHITECTURE.md's kernels table")
    for missing in sorted(set(order) - top):
        problems.append(f"ARCHITECTURE.md's kernels table names {missing}, which kernels/src lacks")
    problems += check_order("kernels/src", lib_order(os.path.join(root, "kernels/src")), order)
    rank = {m: i for i, m in enumerate(order)}
    for a in sorted(adj):
        for b in sorted(adj[a]):
            if a and b and a[0] != b[0] and rank.get(b[0], -1) > rank.get(a[0], -1):
                problems.append(
                    f"kernels: {name(a)} uses {name(b)} ({', '.join(sorted(adj[a][b]))}), "
                    f"a module listed after it"
                )

    # The runtime crate: each folder uses only the layers and crates in its row.
    mods, adj, codes = edges(os.path.join(root, "runtime/src"))
    allowed = {names(row[0])[0]: set(names(row[1])) for row in runtime_rows}
    problems += check_order(
        "runtime/src", lib_order(os.path.join(root, "runtime/src")), [names(r[0])[0] for r in runtime_rows]
    )
    top = {m[0] for m in mods if m}
    for missing in sorted(top - set(allowed)):
        problems.append(f"runtime/src/{missing} is not in ARCHITECTURE.md's runtime table")
    for missing in sorted(set(allowed) - top):
        problems.append(f"ARCHITECTURE.md's runtime table names {missing}/, which runtime/src lacks")
    for a in sorted(adj):
        for b in sorted(adj[a]):
            if a and b and a[0] != b[0] and b[0] not in allowed.get(a[0], set()):
                problems.append(
                    f"runtime: {name(a)} uses {name(b)} ({', '.join(sorted(adj[a][b]))}), "
                    f"but {a[0]}/ may use only: {', '.join(sorted(allowed.get(a[0], ()))) or 'nothing'}"
                )
    for mod, code in sorted(codes.items()):
        for crate, pattern in WATCHED_CRATES.items():
            if mod and mod[0] in allowed and crate not in allowed[mod[0]] and re.search(pattern, code):
                problems.append(f"runtime: {name(mod)} uses the {crate} crate, which {mod[0]}/ may not")

    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print("layers: ok")


if __name__ == "__main__":
    main()
