#!/usr/bin/env python3
"""The code a message runs, from a callgrind profile: how many instructions, and how much
distinct code (docs/bench/kinds.md, session 56).

    insns_per_message.py CALLGRIND_OUT [--per FUNCTION | --messages N] [--top K]
                         [--skip FUNCTION_SUFFIX ...]

CALLGRIND_OUT is written by `valgrind --tool=callgrind --dump-instr=yes` (positions
`instr line`). The message count is the number of calls to FUNCTION (default `send`: one per
message of a ping-pong client) or N. Reported, per message:

- instructions executed, in all and without the inclusive cost of the functions named by
  --skip (waits whose length depends on the peer, e.g. `Waiter::sleep`, `spin_wait`);
- distinct instructions that ran at least N/2 times (code every message runs: its
  footprint), by object, and by function for the --top K functions;
- distinct call sites that made at least N/2 calls (each a return to a new place);
- with --kinds (objdump disassembles each object the profile names), the instructions under
  emulation costs more than their count says, by object: conditional branches (each ends a
  translated block under qemu TCG), calls and returns, indirect jumps and calls, atomic
  read-modify-writes (`lock`-prefixed, `xchg`), system calls and spin-wait hints (`pause`,
  one per turn of a spinning wait that found nothing) — how many run per message, and at how
  many places every message runs one.
"""

import argparse
import collections
import re
import subprocess
import sys


class Profile:
    def __init__(self, path):
        self.names = {"ob": {}, "fn": {}}
        self.cost = collections.Counter()  # (object, function, address) -> instructions run
        self.calls = collections.Counter()  # callee -> calls
        self.inclusive = collections.Counter()  # callee -> inclusive instructions
        self.sites = collections.Counter()  # (object, caller, call address) -> calls
        self.read(path)

    def name(self, kind, text):
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        table = self.names[kind]
        if m.group(2):
            table[m.group(1)] = m.group(2)
        return table[m.group(1)]

    def read(self, path):
        obj = fn = callee = None
        addr = 0
        pending = None  # calls= seen: the next cost line is the call's
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("positions:") and "instr" not in line:
                    sys.exit(f"{path}: no instruction positions (run with --dump-instr=yes)")
                key, _, rest = line.partition("=")
                if key in ("ob", "cob"):
                    named = self.name("ob", rest)
                    if key == "ob":
                        obj = named
                    continue
                if key in ("fn", "cfn"):
                    named = self.name("fn", rest)
                    if key == "fn":
                        fn = named
                    else:
                        callee = named
                    continue
                if key == "calls":
                    pending = int(rest.split()[0])
                    continue
                if not line or not (line[0].isdigit() or line[0] in "+-*"):
                    continue
                parts = line.split()
                a = parts[0]
                if a.startswith("0x"):
                    addr = int(a, 16)
                elif a[0] in "+-":
                    d = int(a[1:], 16) if a[1:].startswith("0x") else int(a[1:])
                    addr += d if a[0] == "+" else -d
                elif a != "*":
                    addr = int(a)
                value = int(parts[-1]) if len(parts) > 1 else 0
                if pending is not None:
                    self.calls[callee] += pending
                    self.inclusive[callee] += value
                    self.sites[(obj, fn, addr)] += pending
                    pending = None
                else:
                    self.cost[(obj, fn, addr)] += value


def summary(p, n, skip=(), top=25):
    """What the report prints, as numbers: per message, `n` messages."""
    total = sum(p.cost.values())
    skipped = sum(v for f, v in p.inclusive.items() if any(f.endswith(s) for s in skip))
    every = {k for k, v in p.cost.items() if v >= n / 2}
    runs = collections.Counter()
    for (_, f, _), v in p.cost.items():
        runs[f] += v
    by_fn = collections.Counter(f for _, f, _ in every)
    return {
        "instructions": total / n,
        "without_skipped": (total - skipped) / n,
        "distinct_by_object": collections.Counter(o for o, _, _ in every),
        "distinct": len(every),
        "sites_by_object": collections.Counter(
            o for (o, _, _), c in p.sites.items() if c >= n / 2
        ),
        "top": [(f, c, runs[f] / n, p.calls[f] / n) for f, c in by_fn.most_common(top)],
    }


# What --kinds counts, in its report's order.
KINDS = ("branch", "call", "indirect", "return", "atomic", "syscall", "pause")


def classify(text):
    """The kind of one disassembled instruction (objdump's text after the address), or None:
    `branch` a conditional jump, `call` a direct call, `indirect` a call or jump through a
    register or memory, `return`, `atomic` a lock-prefixed or an exchange with memory (always
    locked on x86), `syscall`, `pause` (a spinning wait's hint: one per turn that found
    nothing). Direct unconditional jumps are not counted (a chained block)."""
    words = text.split()
    if not words:
        return None
    op = words[0]
    if op.startswith("rep") or op in ("notrack", "bnd"):
        words = words[1:]
        op = words[0] if words else ""
    if op == "lock":
        return "atomic"
    if op.startswith("xchg") and "(" in text:
        return "atomic"
    if op.startswith("ret"):
        return "return"
    if op == "syscall":
        return "syscall"
    if op == "pause":
        return "pause"
    if op.startswith("call") or op.startswith("jmp"):
        if "*" in text:
            return "indirect"
        return "call" if op.startswith("call") else None
    if op.startswith("j"):
        return "branch"
    return None


def disassemble(obj):
    """Address -> instruction text of every instruction objdump finds in `obj` ({} if it
    cannot read it)."""
    try:
        out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                             capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    code = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)$", line)
        if m:
            code[int(m.group(1), 16)] = m.group(2).strip()
    return code


def kinds(p, n, code_of=disassemble):
    """Per object: {kind: (run per message, places every message runs)} for the kinds of
    [`classify`], from each object's disassembly (`code_of(object)`)."""
    code = {}
    run = collections.defaultdict(collections.Counter)
    places = collections.defaultdict(collections.Counter)
    for (obj, _, addr), v in p.cost.items():
        if obj not in code:
            code[obj] = code_of(obj)
        k = classify(code[obj].get(addr, ""))
        if k is None:
            continue
        run[obj][k] += v
        if v >= n / 2:
            places[obj][k] += 1
    return {o: {k: (run[o][k] / n, places[o][k]) for k in KINDS if run[o][k]} for o in run}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("--per", default="send")
    ap.add_argument("--messages", type=int)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--kinds", action="store_true")
    a = ap.parse_args()
    p = Profile(a.profile)
    n = a.messages or p.calls[a.per]
    if not n:
        sys.exit(f"no calls to {a.per!r} in the profile: give --messages")
    r = summary(p, n, a.skip, a.top)
    print(f"messages: {n}")
    print(f"instructions per message: {r['instructions']:.0f}", end="")
    if a.skip:
        print(f" ({r['without_skipped']:.0f} without {', '.join(a.skip)})", end="")
    print()
    print("distinct instructions every message runs, by object:")
    for o, c in r["distinct_by_object"].most_common():
        print(f"  {c:6d}  {o}")
    print(f"  {r['distinct']:6d}  all")
    print("distinct call sites every message passes, by object of the caller:")
    for o, c in r["sites_by_object"].most_common():
        print(f"  {c:6d}  {o}")
    print(f"the {a.top} functions with the most distinct code per message "
          "(distinct instructions, instructions run per message, calls per message):")
    for f, c, run, calls in r["top"]:
        print(f"  {c:5d} {run:8.1f} {calls:6.2f}  {f[:100]}")
    if a.kinds:
        print("instructions emulation charges apart, by object (run per message / places "
              "every message runs one):")
        print("  " + "".join(f"{k:>16}" for k in KINDS) + "  object")
        for o, ks in sorted(kinds(p, n).items()):
            cells = "".join(
                f"{ks[k][0]:10.1f} /{ks[k][1]:4d}" if k in ks else f"{'-':>16}" for k in KINDS)
            print(f"  {cells}  {o}")


if __name__ == "__main__":
    main()
