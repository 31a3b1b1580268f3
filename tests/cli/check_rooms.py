"""k3run's rooms stay clean (README "Layout"): fails, naming the file and the
line, on

  - an #include of a room above, or of a sibling: main.c -> cli/ and serve/ ->
    run/ -> text/ and engine/ -> kernels/, dist/ (siblings do not see each
    other: text and engine, cli and serve);
  - a header of engine/ other than engine.h included outside engine/ (its one
    public face), and k3inspect including anything of k3run's but engine.h;
  - a room's private header (*_impl.h, kern_simd.h) included outside its room;
  - a circle of files: with --lib ROOM=ARCHIVE for each room's static library,
    an object calling a function of an object that calls back (directly or
    round a longer circle), or calling into a room it may not include;
  - a k3run source file over 1500 lines, or a source file in k3run/ beside
    main.c instead of in a room.

Usage: check_rooms.py SRC [--lib ROOM=libk3x.a ...]
"""

import os
import re
import subprocess
import sys

ROOMS = ("kernels", "dist", "engine", "text", "run", "cli", "serve")
# what each part may include (itself always): downward only
MAY = {
    "kernels": set(),
    "dist": set(),
    "engine": {"kernels", "dist"},
    "text": {"kernels"},
    "run": {"engine", "text", "kernels", "dist"},
    "cli": {"run", "engine", "text", "kernels", "dist"},
    "serve": {"run", "engine", "text", "kernels", "dist"},
    "main": {"cli", "serve", "run", "engine", "text", "kernels", "dist"},
    "k3inspect": {"engine"},
}
PUBLIC = {"engine": {"engine.h"}}          # a room reached only through these headers
PRIVATE = re.compile(r"(_impl\.h|^kern_simd\.h)$")
MAX_LINES = 1500
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

problems = []


def sources(d):
    for name in sorted(os.listdir(d)):
        if name.endswith((".c", ".h")):
            yield os.path.join(d, name)


def check_includes(src):
    k3run = os.path.join(src, "k3run")
    room_of = {}                                   # header basename -> room
    for room in ROOMS:
        d = os.path.join(k3run, room)
        if not os.path.isdir(d):
            problems.append("k3run/%s: the room is missing" % room)
            continue
        for p in sources(d):
            room_of[os.path.basename(p)] = room
    files = []                                     # (path, the part it belongs to)
    for name in sorted(os.listdir(k3run)):
        p = os.path.join(k3run, name)
        if name.endswith((".c", ".h")) and name != "main.c":
            problems.append("k3run/%s: a source file outside the rooms (put it in one of %s)" % (name, ", ".join(ROOMS)))
    files.append((os.path.join(k3run, "main.c"), "main"))
    for room in ROOMS:
        d = os.path.join(k3run, room)
        if os.path.isdir(d):
            files += [(p, room) for p in sources(d)]
    files += [(p, "k3inspect") for p in sources(os.path.join(src, "k3inspect"))]
    for path, part in files:
        rel = os.path.relpath(path, src)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if part != "k3inspect" and len(lines) > MAX_LINES:
            problems.append("%s: %d lines, more than %d (split it)" % (rel, len(lines), MAX_LINES))
        for no, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            name = os.path.basename(m.group(1))
            to = room_of.get(name)
            if to is None or to == part:
                continue                           # common/, formats/, the tool's own, or the same room
            where = "%s:%d: #include \"%s\"" % (rel, no, m.group(1))
            if to not in MAY[part]:
                problems.append("%s: %s may not include %s/ (only %s)" % (
                    where, part, to, ", ".join(sorted(MAY[part])) or "nothing above common/ and formats/"))
            elif to in PUBLIC and name not in PUBLIC[to]:
                problems.append("%s: outside %s/ include only %s" % (where, to, " ".join(sorted(PUBLIC[to]))))
            elif PRIVATE.search(name):
                problems.append("%s: %s is private to %s/" % (where, name, to))


def check_objects(libs):
    """Objects of the rooms' archives: who calls whom, no circle, no call into a room not allowed."""
    defined, undefined, room_of = {}, {}, {}
    for room, lib in libs:
        out = subprocess.run(["nm", "-A", lib], stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        for line in out.split("\n"):
            m = re.match(r"^[^:]+:([^:]+):\s*(?:[0-9a-fA-F]+)?\s+([A-Za-z])\s+(\S+)$", line)
            if not m:
                continue
            obj, kind, sym = m.groups()
            obj = "%s/%s" % (room, re.sub(r"\.o(bj)?$", "", obj))
            room_of[obj] = room
            undefined.setdefault(obj, set())
            if kind == "U":
                undefined[obj].add(sym)
            elif kind in "TDBRC":
                defined[sym] = obj
    graph = {o: sorted({defined[s] for s in u if s in defined and defined[s] != o}) for o, u in undefined.items()}
    for o, outs in graph.items():
        for t in outs:
            if room_of[t] != room_of[o] and room_of[t] not in MAY[room_of[o]]:
                problems.append("%s calls %s: %s/ may not call into %s/" % (o, t, room_of[o], room_of[t]))
    # circles: Tarjan's strongly connected components
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
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
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    for c in comps:
        problems.append("a circle of files calling each other: %s" % " <-> ".join(c))
    return len(graph)


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    src, libs, i = argv[0], [], 1
    while i < len(argv):
        if argv[i] == "--lib" and i + 1 < len(argv) and "=" in argv[i + 1]:
            room, lib = argv[i + 1].split("=", 1)
            if room not in ROOMS:
                print("check_rooms: unknown room '%s'" % room, file=sys.stderr)
                return 2
            libs.append((room, lib))
            i += 2
        else:
            print("check_rooms: unexpected argument '%s'" % argv[i], file=sys.stderr)
            return 2
    check_includes(src)
    n_obj = check_objects(libs) if libs else 0
    for p in problems:
        print("check_rooms: %s" % p)
    if problems:
        print("check_rooms: %d problem(s)" % len(problems))
        return 1
    print("check_rooms: rooms clean (includes of k3run/ and k3inspect/; %d objects, no circle)" % n_obj)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
