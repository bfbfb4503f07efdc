#!/usr/bin/env python3
"""Checks that the arrows point one way (docs/architecture.md, "Arrows").

Two graphs, and a cycle in either fails the check:

- the crates: an arrow from a workspace crate (or the facade at the root) to
  each workspace crate in its Cargo.toml's [dependencies] (dev-dependencies
  are left out: a test may use a crate above the one it tests);
- the rooms of each crate: a file `src/x.rs` or a directory `src/x/` is room
  `x` (lib.rs and main.rs are the crate's root, which may name any room), and
  an arrow runs from room `x` to room `y` when code in `x` names `crate::y` or
  reaches `y` through `super::` (comments and strings do not count).

One more check on the manifests: the examples' package (examples/) depends
on exactly what the command (crates/cli) depends on, with the same features,
so that the container image's two binaries build on one set of dependencies
(examples/Cargo.toml says why); a difference fails the check.

usage: scripts/check-arrows.py [--self-test] [ROOT]
Prints every strongly connected set of crates or rooms (each a set of cycles)
with the places that make its arrows, and exits 1 if there is any.
Python 3.9 or later, standard library only.
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strongly_connected(graph):
    """The sets of nodes that reach each other (Tarjan), only those that
    hold a cycle: two or more nodes, or one with an arrow to itself. Each
    set sorted, the list sorted; iterative, so deep graphs do not recurse."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    nodes = sorted(set(graph) | {m for targets in graph.values() for m in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in graph.get(node, ()):
                    found.append(sorted(members))
    return sorted(found)


def witness_cycle(graph, members):
    """One cycle through the first member of a strongly connected set, as a
    list of nodes that starts and ends with it (breadth first: a shortest)."""
    inside = set(members)
    start = members[0]
    previous = {}
    queue = [start]
    for node in queue:  # bounded: each node enters the queue at most once
        for target in sorted(graph.get(node, ())):
            if target not in inside:
                continue
            if target == start:
                back = [node]
                while back[-1] != start:  # bounded: `previous` is a tree
                    back.append(previous[back[-1]])
                return list(reversed(back)) + [start]
            if target not in previous:
                previous[target] = node
                queue.append(target)
    return members


# What is not code: a line comment, a block comment (not nested: the
# workspace has none), a raw string, a string, a char literal (not a
# lifetime such as 'a).
NOT_CODE = re.compile(
    r"//[^\n]*"
    r"|/\*.*?\*/"
    r'|(?<![A-Za-z0-9_])b?r(?P<hashes>#*)".*?"(?P=hashes)'
    r'|"(?:\\.|[^"\\])*"'
    r"|'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'",
    re.S,
)


def strip_comments_and_strings(text):
    """The source with comments, string and char literals blanked (newlines
    kept, so line numbers stay)."""
    return NOT_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def group_heads(text, start):
    """The first name of each item of the `{...}` group that opens at
    `start`: `{a, b::c, d::{e}}` gives a, b, d."""
    heads, depth, item_start = [], 0, start + 1
    for j in range(start, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                heads.append(text[item_start:j])
                break
        elif c == "," and depth == 1:
            heads.append(text[item_start:j])
            item_start = j + 1
    names = []
    for item in heads:
        m = re.match(r"\s*(" + IDENT + ")", item)
        if m:
            names.append(m.group(1))
    return names


PATH = re.compile(r"(?<![A-Za-z0-9_:])(crate|super|self)((?:\s*::\s*super)*)\s*::\s*(\{|" + IDENT + ")")
INLINE_MOD = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")
CFG_TEST = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")


def test_modules_inline(code):
    """The names of the inline modules compiled only for tests."""
    return {m.group(1) for m in CFG_TEST.finditer(code) if m.group(2) == "{"}


def test_module_files(code):
    """The names of the modules in their own files compiled only for tests."""
    return {m.group(1) for m in CFG_TEST.finditer(code) if m.group(2) == ";"}


def references(text, module):
    """(line, module path) of every path this file's code names through
    `crate::` or `super::`, resolved to a path from the crate root; `module`
    is the file's own module path (`["x", "y"]` for src/x/y.rs). Code only
    compiled for tests (`#[cfg(test)] mod ...`) is left out, as the crates'
    dev-dependencies are: a test may use any room."""
    code = strip_comments_and_strings(text)
    # Inline modules (`mod tests { ... }`) nest the module path: find their
    # spans by brace depth.
    spans = []
    for m in INLINE_MOD.finditer(code):
        depth, j = 0, m.end() - 1
        for j in range(m.end() - 1, len(code)):
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
                if depth == 0:
                    break
        spans.append((m.start(), j, m.group(1)))
    tests = [(a, b) for (a, b, name) in spans if name in test_modules_inline(code)]
    found = []
    for m in PATH.finditer(code):
        if any(a < m.start() < b for (a, b) in tests):
            continue
        inner = [name for (a, b, name) in spans if a < m.start() < b]
        here = list(module) + inner
        kind, supers, head = m.group(1), m.group(2), m.group(3)
        if kind == "crate":
            base = []
        elif kind == "self":
            base = here
        else:
            ups = 1 + supers.count("super")
            if ups > len(here):
                continue
            base = here[: len(here) - ups]
        names = group_heads(code, m.start(3)) if head == "{" else [head]
        line = code.count("\n", 0, m.start()) + 1
        for name in names:
            if name in ("self", "super", "crate"):
                found.append((line, base))
            else:
                found.append((line, base + [name]))
    return found


def rooms_of(src):
    """room name -> list of (file, module path) for a crate's src/."""
    rooms = {}
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry.endswith(".rs") and os.path.isfile(path):
            name = entry[:-3]
            if name in ("lib", "main"):
                continue
            rooms.setdefault(name, []).append((path, [name]))
        elif os.path.isdir(path) and entry != "bin":
            for folder, _dirs, files in sorted(os.walk(path)):
                for file in sorted(files):
                    if not file.endswith(".rs"):
                        continue
                    rel = os.path.relpath(os.path.join(folder, file), src)[:-3].split(os.sep)
                    if rel[-1] == "mod":
                        rel = rel[:-1]
                    rooms.setdefault(entry, []).append((os.path.join(folder, file), rel))
    return rooms


def room_graph(src):
    """The arrows between a crate's rooms: {room: {room}}, and where each
    arrow is first made: {(from, to): "file:line"}."""
    rooms = rooms_of(src)
    texts, test_only = {}, set()
    for files in rooms.values():
        for path, module in files:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
            for name in test_module_files(strip_comments_and_strings(texts[path])):
                test_only.add(tuple(module + [name]))
    for top in ("lib.rs", "main.rs"):
        if os.path.isfile(os.path.join(src, top)):
            with open(os.path.join(src, top), encoding="utf-8") as f:
                for name in test_module_files(strip_comments_and_strings(f.read())):
                    test_only.add((name,))
    graph, where = {room: set() for room in rooms}, {}
    for room, files in rooms.items():
        for path, module in files:
            if any(tuple(module[:k]) in test_only for k in range(1, len(module) + 1)):
                continue
            text = texts[path]
            for line, target in references(text, module):
                if not target or target[0] == room or target[0] not in rooms:
                    continue
                graph[room].add(target[0])
                where.setdefault((room, target[0]), "%s:%d" % (path, line))
    return graph, where


def dependency_names(cargo_toml):
    """The names in a Cargo.toml's [dependencies] tables (also
    [target.*.dependencies] and [build-dependencies]), not dev-dependencies."""
    names, inside = [], False
    with open(cargo_toml, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            header = re.match(r"^\[(.+)\]$", line)
            if header:
                table = header.group(1).strip()
                inside = table in ("dependencies", "build-dependencies") or (
                    table.startswith("target.") and table.endswith((".dependencies", ".build-dependencies")))
                single = re.match(r"^(?:target\..+\.)?(?:build-)?dependencies\.([A-Za-z0-9_-]+)$", table)
                if single:
                    names.append(single.group(1))
                continue
            if inside:
                m = re.match(r"^([A-Za-z0-9_-]+)\s*[.=]", line)
                if m:
                    names.append(m.group(1))
    return names


def table_lines(cargo_toml, table):
    """The lines of one `[table]` of a Cargo.toml, comments stripped."""
    inside = False
    with open(cargo_toml, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if line.startswith("["):
                inside = line == "[%s]" % table
            elif inside:
                yield line


def dependency_entries(cargo_toml):
    """{name: spec} of a Cargo.toml's [dependencies] table, each spec with
    its `path = "..."` left out (two packages at different depths name the
    same crate by different paths) and its blanks removed."""
    entries = {}
    for line in table_lines(cargo_toml, "dependencies"):
        m = re.match(r"^([A-Za-z0-9_-]+)\s*([.=].*)$", line)
        if m:
            spec = re.sub(r'path\s*=\s*"[^"]*"\s*,?', "", m.group(2))
            entries[m.group(1)] = re.sub(r"\s+", "", spec).replace(",}", "}")
    return entries


# Packages whose [dependencies] must be another's: (package dir, its twin).
TWINS = [("examples", os.path.join("crates", "cli"))]


def twins_differ(root):
    """Prints how each package of TWINS differs from its twin; how many do."""
    differ = 0
    for folder, twin in TWINS:
        mine = os.path.join(root, folder, "Cargo.toml")
        theirs = os.path.join(root, twin, "Cargo.toml")
        if not (os.path.isfile(mine) and os.path.isfile(theirs)):
            continue
        a, b = dependency_entries(mine), dependency_entries(theirs)
        if a == b:
            continue
        differ += 1
        print("%s/Cargo.toml's [dependencies] are not %s/Cargo.toml's:" % (folder, twin))
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                print("    %s: %s here, %s there" % (name, a.get(name, "missing"), b.get(name, "missing")))
    return differ


def package_name(cargo_toml):
    for line in table_lines(cargo_toml, "package"):
        m = re.match(r'^name\s*=\s*"([^"]+)"', line)
        if m:
            return m.group(1)
    return None


def crates(root):
    """(package name, crate dir) of the facade at the root, the examples'
    package and every crate under crates/."""
    found = []
    candidates = [root, os.path.join(root, "examples")] + sorted(
        os.path.join(root, "crates", d) for d in os.listdir(os.path.join(root, "crates")))
    for folder in candidates:
        toml = os.path.join(folder, "Cargo.toml")
        if os.path.isfile(toml):
            name = package_name(toml)
            if name:
                found.append((name, folder))
    return found


def report(title, graph, where):
    """Prints each cycle set of `graph`; how many there are."""
    sets = strongly_connected(graph)
    for members in sets:
        print("cycle in %s: %s" % (title, " -> ".join(witness_cycle(graph, members))))
        for a in members:
            for b in sorted(graph.get(a, ())):
                if b in members:
                    print("    %s -> %s  (%s)" % (a, b, where.get((a, b), "Cargo.toml")))
    return len(sets)


def check(root):
    packages = crates(root)
    names = {name for name, _ in packages}
    crate_graph, crate_where = {}, {}
    cycles = 0
    for name, folder in packages:
        toml = os.path.join(folder, "Cargo.toml")
        crate_graph[name] = {d for d in dependency_names(toml) if d in names and d != name}
        for d in crate_graph[name]:
            crate_where[(name, d)] = os.path.relpath(toml, root)
        src = os.path.join(folder, "src")
        if os.path.isdir(src):
            graph, where = room_graph(src)
            where = {k: os.path.relpath(v, root) for k, v in where.items()}
            cycles += report("the rooms of " + name, graph, where)
    cycles += report("the crates", crate_graph, crate_where)
    return cycles


# The cycle finder's table: arrows, and the cycle sets it must find.
CASES = [
    ("no arrows", {}, []),
    ("a line", {"a": {"b"}, "b": {"c"}}, []),
    ("two rooms import each other", {"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ("an arrow to itself", {"a": {"a"}}, [["a"]]),
    ("a diamond is no cycle", {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}}, []),
    ("a ring of three", {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ("two separate cycles", {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}, "b2": {"c"}},
     [["a", "b"], ["c", "d"]]),
    ("two rings joined into one set", {"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}, [["a", "b", "c"]]),
]

# The reference finder's table: source, the file's module path, the module
# paths it must name.
REFERENCES = [
    ("use crate::delivery::Delivery;", ["finish"], [["delivery"]]),
    ("use super::outcome::Outcome;", ["finish"], [["outcome"]]),
    ("use super::Sibling;", ["a", "b"], [["a", "Sibling"]]),
    ("use super::super::c::D;", ["a", "b"], [["c"]]),
    ("use crate::{a::X, b, c::{d, e}};", ["z"], [["a"], ["b"], ["c"]]),
    ("// use crate::commented::Out;\nlet s = \"crate::in_a_string\";", ["z"], []),
    ("mod tests {\n    use super::helper;\n}", ["a"], [["a", "helper"]]),
    ("fn f<'a>(x: &'a str) { crate::b::g(x) }", ["a"], [["b"]]),
    ("let c = '{'; /* crate::x */ let r = r#\"crate::y\"#; crate::b::h()", ["a"], [["b"]]),
    ("use super::{Consumer, delivery::Delivery};", ["lane"], [["Consumer"], ["delivery"]]),
    ("#[cfg(test)]\nmod tests {\n    use crate::memory::Store;\n}\nuse crate::b::C;", ["a"], [["b"]]),
]


def tree_test():
    """The whole check on a small workspace with one cycle of each kind:
    two crates that depend on each other, and two rooms of one crate that
    import each other (one by `crate::`, one by `super::`), beside a room
    that only imports down and test code that imports up."""
    import contextlib
    import io
    import tempfile

    files = {
        "Cargo.toml": '[workspace]\nmembers = ["crates/*"]\n',
        "crates/a/Cargo.toml": '[package]\nname = "a"\n\n[dependencies]\nb = { path = "../b" }\n',
        "crates/b/Cargo.toml": '[package]\nname = "b"\n\n[dependencies]\na.workspace = true\n'
        '\n[dev-dependencies]\nc.workspace = true\n',
        "crates/c/Cargo.toml": '[package]\nname = "c"\n\n[dependencies]\nb.workspace = true\n',
        "crates/a/src/lib.rs": "mod x;\nmod y;\nmod z;\nuse crate::x::X;\n",
        "crates/a/src/x.rs": "use crate::y::Y;\n",
        "crates/a/src/y.rs": "pub struct Y;\nfn f() { super::x::g() }\n",
        "crates/a/src/z.rs": "use crate::x::X;\n#[cfg(test)]\nmod tests {\n    use crate::w::W;\n}\n",
        "crates/a/src/w.rs": "// use crate::z::Z;\nconst S: &str = \"crate::z\";\n",
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in files.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cycles = check(root)
    want = ["cycle in the rooms of a: x -> y -> x", "cycle in the crates: a -> b -> a"]
    got = [line for line in out.getvalue().splitlines() if line.startswith("cycle")]
    if cycles != 2 or got != want:
        print("FAIL the tree test: found %d %s, want 2 %s" % (cycles, got, want))
        return 1
    return twins_test()


def twins_test():
    """The examples' package against the command's: the same list (paths
    apart, comments and blanks aside) passes; a feature or a crate more or
    less fails, naming it."""
    import contextlib
    import io
    import tempfile

    cli = ('[package]\nname = "cli"\n\n[dependencies]\n# why\nfacade = { path = "../.." }\n'
           'tokio = { workspace = true, features = ["fs"] }\nclap.workspace = true\n'
           '\n[dev-dependencies]\nkit.workspace = true\n')
    rows = [
        ('facade = { path = ".." }\ntokio = {workspace = true, features = ["fs"]}\nclap.workspace = true\n', 0, ""),
        ('facade = { path = ".." }\ntokio = { workspace = true }\nclap.workspace = true\n', 1, "tokio"),
        ('facade = { path = ".." }\ntokio = { workspace = true, features = ["fs"] }\n', 1, "clap"),
    ]
    failures = 0
    for deps, want, named in rows:
        with tempfile.TemporaryDirectory() as root:
            for name, text in {"crates/cli/Cargo.toml": cli,
                               "examples/Cargo.toml": '[package]\nname = "examples"\n\n[dependencies]\n' + deps}.items():
                path = os.path.join(root, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                got = twins_differ(root)
        if got != want or (named and ("    %s:" % named) not in out.getvalue()):
            print("FAIL the twins test: %r gave %d (%s), want %d naming %r" % (deps, got, out.getvalue(), want, named))
            failures += 1
    return failures


def self_test():
    failures = 0
    for name, graph, want in CASES:
        got = strongly_connected(graph)
        if got != want:
            print("FAIL %s: found %s, want %s" % (name, got, want))
            failures += 1
        for members in got:
            cycle = witness_cycle(graph, members)
            ok = cycle[0] == cycle[-1] and all(b in graph.get(a, ()) for a, b in zip(cycle, cycle[1:]))
            if not ok:
                print("FAIL %s: %s is not a cycle" % (name, cycle))
                failures += 1
    for source, module, want in REFERENCES:
        got = [path for _line, path in references(source, module)]
        if got != want:
            print("FAIL references of %r: found %s, want %s" % (source, got, want))
            failures += 1
    failures += tree_test()
    total = len(CASES) + len(REFERENCES) + 1
    print("check-arrows self-test: %d of %d cases pass" % (total - failures, total))
    return failures


def main(argv):
    if "--self-test" in argv:
        return 1 if self_test() else 0
    args = [a for a in argv if not a.startswith("-")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    cycles = check(os.path.abspath(root))
    if cycles:
        print("check-arrows: %d cycle set(s); move the shared piece down into a room (or crate) both use" % cycles)
        return 1
    if twins_differ(os.path.abspath(root)):
        print("check-arrows: give both packages the same [dependencies] (examples/Cargo.toml says why)")
        return 1
    print("check-arrows: no cycles between crates or between the rooms of a crate; "
          "the examples depend on what the command does")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
