"""The package's import graph has no circles (issue 54): every import between its modules, those
inside functions included (the package imports heavy libraries lazily), read from the sources.
The io / keys / runtime circle of 2780969 (io -> keys.describe_change -> runtime.versions -> io)
was broken by moving the key-diff helpers to io, the ground floor that owns hashing and writes."""

from __future__ import annotations

from pwopsd import keys


def import_graph() -> dict[str, set[str]]:
    root = keys.PACKAGE_ROOT
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    # a module's own package (whose __init__ runs first) is not an arrow of its design
    return {m: {i for i in keys._imported_modules(p, m) if i in modules and i != m and not m.startswith(i + ".")}
            for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_circles_are_found_when_there_is_one():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circles():
    graph = import_graph()
    assert {"pwopsd.io", "pwopsd.keys", "pwopsd.runtime"} <= set(graph)
    assert circles(graph) == []


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between rooms: a subpackage (``pwopsd.status``) or a top-level module
    (``pwopsd.io``) imports another when one of its modules does."""
    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {}
    for module, imported in graph.items():
        rooms.setdefault(room(module), set()).update(room(m) for m in imported if room(m) != room(module))
    return rooms


def test_no_arrow_runs_back_up_between_rooms():
    """With no circle between rooms, the rooms stack into floors (a room above every room it
    imports): an import that closes a circle between two subpackages, e.g. a module of
    pwopsd.status importing pwopsd.cost while one of pwopsd.cost imports pwopsd.status, is an
    arrow running back up, even when no two modules form a circle."""
    planted = room_graph({"pwopsd.a.x": {"pwopsd.b.y"}, "pwopsd.b.y": set(), "pwopsd.b.z": {"pwopsd.a.w"},
                          "pwopsd.a.w": set()})
    assert circles(planted) == [["pwopsd.a", "pwopsd.b"]]
    rooms = room_graph(import_graph())
    assert len(rooms) > 20 and circles(rooms) == []


ROOM_LIMIT = 500  # lines: a module longer than this holds more than one idea (issue 54)


def test_no_room_is_over_500_lines():
    long = {str(p.relative_to(keys.PACKAGE_ROOT.parent)): n for p in keys.PACKAGE_ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > ROOM_LIMIT}
    assert long == {}, f"split these modules along the ideas they hold: {long}"
