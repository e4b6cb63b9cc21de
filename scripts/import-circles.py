#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a circle.

    scripts/import-circles.py [--root DIR]

Why: a crate whose files import each other both ways has no order a reader
can follow; every module is then tied to every other, and a change anywhere
can reach anywhere (issue 57). Imports must point one way, down: a module
may take from the modules below it, never from its caller.

How: for every Rust crate under crates/ (each target root: src/lib.rs,
src/main.rs, src/bin/*.rs), it maps each source file to its module path,
reads the paths a file names (`use crate::..`, `super::..`, `self::..`,
inline `crate::a::b`, and the children it declares with `mod x;` when it
names them as `x::..`), resolves each to the deepest module file that
defines it, and finds the strongly connected components of the file graph.
A component of two or more files is a circle. Names a module takes from
its ancestors' files (the target's root, lib.rs or main.rs, and a folder's
mod.rs) are not counted: a parent is its children's table of contents,
declaring them and what they share, so a child reaching it is the
convention, not a tangle (a parent that calls into its children while they
reach back is one file split in two; keep that to what they share). Test modules (everything
after a top-level `#[cfg(test)]`) are left out: tests may reach anywhere.

Exit status 0: no circle; 1: one or more, each printed with
the names that tie it; 2: bad usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments_and_strings(text: str) -> str:
    """Blanks out comments, string and char literals (keeps line structure)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and not re.match(
            r"[A-Za-z0-9_]", text[i - 1] if i else " "
        ):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(text: str) -> str:
    """The text without test-only modules: everything from a top-level
    `#[cfg(test)]` inline module on, and `#[cfg(test)] mod x;` lines."""
    match = re.search(r"^#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text, re.MULTILINE)
    text = text if match is None else text[: match.start()]
    return re.sub(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text)


def expand_use_tree(tree: str) -> list[list[str]]:
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (aliases and
    globs dropped, `self` folded into its parent)."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    paths: list[list[str]] = []

    def walk(prefix: list[str], part: str) -> None:
        if "{" not in part:
            names = [p for p in part.split("::") if p and p != "*"]
            if names and names[-1] == "self":
                names = names[:-1]
            paths.append(prefix + names)
            return
        head, rest = part.split("{", 1)
        inner = rest[: rest.rfind("}")]
        head_names = [p for p in head.split("::") if p]
        depth, start = 0, 0
        for i, c in enumerate(inner + ","):
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            elif c == "," and depth == 0:
                item = inner[start:i]
                if item:
                    walk(prefix + head_names, item)
                start = i + 1

    walk([], tree)
    return paths


class Crate:
    """One target of one crate: its files and their module paths."""

    def __init__(self, root_file: Path) -> None:
        self.root_file = root_file
        self.modules: dict[tuple[str, ...], Path] = {}
        self.collect(root_file, ())

    def collect(self, file: Path, path: tuple[str, ...]) -> None:
        self.modules[path] = file
        text = without_tests(strip_comments_and_strings(file.read_text()))
        directory = (
            file.parent
            if file.name in ("mod.rs", "lib.rs", "main.rs") or file == self.root_file
            else file.parent / file.stem
        )
        for match in re.finditer(
            r"(#\[path\s*=\s*\"\"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;",
            text,
        ):
            if match.group(1):
                continue  # a #[path] module: shared code, not of this tree
            name = match.group(2)
            for candidate in (directory / f"{name}.rs", directory / name / "mod.rs"):
                if candidate.exists():
                    self.collect(candidate, path + (name,))
                    break

    def resolve(self, path: list[str]) -> Path | None:
        """The deepest module file on `path`."""
        for length in range(len(path), -1, -1):
            file = self.modules.get(tuple(path[:length]))
            if file is not None:
                return file
        return None

    def edges(self) -> dict[Path, dict[Path, set[str]]]:
        graph: dict[Path, dict[Path, set[str]]] = {f: {} for f in self.modules.values()}
        for module, file in self.modules.items():
            text = without_tests(strip_comments_and_strings(file.read_text()))
            children = {name for (*parent, name) in (m for m in self.modules if m) if tuple(parent) == module}
            named: list[list[str]] = []
            for use in re.finditer(r"\buse\s+([^;]+);", text):
                named.extend(expand_use_tree(use.group(1)))
            for inline in re.finditer(r"\b((?:crate|super|self)(?:::" + IDENT + r")+)", text):
                named.append(inline.group(1).split("::"))
            for inline in re.finditer(r"(?<![:\w])(" + IDENT + r")::(" + IDENT + r")", text):
                if inline.group(1) in children:
                    named.append([inline.group(1), inline.group(2)])
            for path in named:
                absolute = self.absolute(module, path, children)
                if absolute is None:
                    continue
                target = self.resolve(absolute)
                if target is not None and target not in (file, self.root_file) and not self.is_ancestor(target, module):
                    graph[file].setdefault(target, set()).add(absolute[-1])
        return graph

    def is_ancestor(self, target: Path, module: tuple[str, ...]) -> bool:
        """Whether `target` is the file of one of `module`'s ancestors."""
        return any(self.modules.get(module[:length]) == target for length in range(len(module)))

    @staticmethod
    def absolute(module: tuple[str, ...], path: list[str], children: set[str]) -> list[str] | None:
        if not path:
            return None
        if path[0] == "crate":
            return path[1:]
        if path[0] in ("self", "super"):
            base = list(module)
            while path and path[0] in ("self", "super"):
                if path[0] == "super":
                    if not base:
                        return None
                    base.pop()
                path = path[1:]
            return base + path
        if path[0] in children:
            return list(module) + path
        return None


def circles(graph: dict[Path, dict[Path, set[str]]]) -> list[list[Path]]:
    """Strongly connected components of two or more files (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[Path]] = []
    sys.setrecursionlimit(10_000)

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def target_roots(root: Path) -> list[Path]:
    roots = []
    for crate in sorted((root / "crates").iterdir()):
        src = crate / "src"
        for name in ("lib.rs", "main.rs"):
            if (src / name).exists():
                roots.append(src / name)
        roots.extend(sorted((src / "bin").glob("*.rs")) if (src / "bin").is_dir() else [])
    return roots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the workspace (default: this one)")
    args = parser.parse_args()
    root_dir = args.root.resolve()
    failed = 0
    for root in target_roots(root_dir):
        crate = Crate(root)
        graph = crate.edges()
        for circle in circles(graph):
            members = set(circle)
            print(f"import circle of {len(circle)} files:")
            for file in circle:
                for target, tied in sorted(graph[file].items()):
                    if target in members:
                        print(
                            f"  {file.relative_to(root_dir)} -> {target.relative_to(root_dir)}: "
                            + ", ".join(sorted(tied))
                        )
            failed += 1
    if failed:
        print(
            f"{failed} import circle(s): make the imports point one way (ARCHITECTURE.md, "
            "'Layers'): move what both sides need below them, or pass it in."
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
