"""Tests of insns_per_message.py, the code a message runs from a callgrind profile (stdlib
unittest; scripts/test runs them in the host tier): the compressed names and relative
addresses of callgrind's format, calls kept apart from the caller's own cost, and what counts
as code every message runs."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import insns_per_message  # noqa: E402

# Four messages: `send` (in app) called 4 times from main; its body at 0x100..0x102 runs 4
# times, 0x103 twice (half: still every message's code), 0x104 once (a rare branch); it calls
# `post` (in lib) 4 times from 0x101, whose 2 instructions run 4 times each, and `sleep` once
# from 0x102, which runs 10 instructions (a wait, to be skipped).
PROFILE = """# callgrind format
version: 1
positions: instr line
events: Ir

ob=(1) /bin/app
fl=(1) app.c
fn=(1) main
0x10 1 1
cfn=(2) send
calls=4 0x100
+2 1 40

fn=(2)
0x100 2 4
+1 2 4
cob=(2) /lib/lib.so
cfi=(2) lib.c
cfn=(3) post
calls=4 0x200
* 2 8
+1 2 4
cob=(2)
cfn=(4) sleep
calls=1 0x300
* 2 10
+1 2 2
+1 2 1

ob=(2)
fl=(2)
fn=(3)
0x200 3 4
+1 3 4
fn=(4)
0x300 4 10
"""


def profile(text=PROFILE):
    d = tempfile.mkdtemp()
    path = os.path.join(d, "callgrind.out")
    with open(path, "w") as f:
        f.write(text)
    return insns_per_message.Profile(path)


class Profiles(unittest.TestCase):
    def test_names_addresses_and_calls(self):
        p = profile()
        self.assertEqual(p.calls["send"], 4)
        self.assertEqual(p.calls["post"], 4)
        self.assertEqual(p.inclusive["sleep"], 10)
        # (relative addresses: 0x100, +1, a call at the current one, +1, a call, +1, +1)
        self.assertEqual(p.cost[("/bin/app", "send", 0x101)], 4)
        self.assertEqual(p.cost[("/bin/app", "send", 0x102)], 4)
        self.assertEqual(p.cost[("/bin/app", "send", 0x103)], 2)
        self.assertEqual(p.cost[("/bin/app", "send", 0x104)], 1)
        self.assertEqual(p.cost[("/lib/lib.so", "post", 0x201)], 4)
        # (a call's inclusive cost is not its caller's own)
        self.assertEqual(sum(v for (o, f, a), v in p.cost.items() if f == "send"), 4 * 3 + 2 + 1)

    def test_summary_per_message(self):
        r = insns_per_message.summary(profile(), 4, skip=["sleep"])
        total = 1 + (4 * 3 + 2 + 1) + 8 + 10
        self.assertAlmostEqual(r["instructions"], total / 4)
        self.assertAlmostEqual(r["without_skipped"], (total - 10) / 4)
        # every message: send's 0x100..0x102, 0x103 (twice = half); post's two; sleep's
        # instruction ran 10 times (a loop) and counts; main's one and 0x104 do not
        self.assertEqual(r["distinct_by_object"]["/bin/app"], 4)
        self.assertEqual(r["distinct_by_object"]["/lib/lib.so"], 3)
        self.assertEqual(r["distinct"], 7)
        # call sites every message passes: main's call of send, send's of post (not sleep's)
        self.assertEqual(r["sites_by_object"]["/bin/app"], 2)
        top = {f: (c, run, calls) for f, c, run, calls in r["top"]}
        self.assertEqual(top["send"][0], 4)
        self.assertAlmostEqual(top["post"][1], 2.0)
        self.assertAlmostEqual(top["post"][2], 1.0)

    def test_instruction_kinds(self):
        c = insns_per_message.classify
        self.assertEqual(c("jne    4a10 <f+0x20>"), "branch")
        self.assertEqual(c("jmp    4a10 <f+0x20>"), None)
        self.assertEqual(c("jmp    *%rax"), "indirect")
        self.assertEqual(c("notrack jmp *%rax"), "indirect")
        self.assertEqual(c("call   *0x10(%rbx)"), "indirect")
        self.assertEqual(c("call   1230 <post>"), "call")
        self.assertEqual(c("ret"), "return")
        self.assertEqual(c("rep ret"), "return")
        self.assertEqual(c("lock cmpxchg %rcx,(%rdi)"), "atomic")
        self.assertEqual(c("xchg   %rax,(%rdi)"), "atomic")
        self.assertEqual(c("xchg   %ax,%ax"), None)
        self.assertEqual(c("syscall"), "syscall")
        self.assertEqual(c("pause"), "pause")
        self.assertEqual(c("mov    %rdi,%rax"), None)
        self.assertEqual(c(""), None)

    def test_kinds_per_message(self):
        # send: a branch at 0x100 (every message), its calls of post and sleep at 0x101 and
        # 0x102 (the call instructions are the caller's own cost, once per run), an atomic at
        # 0x104 (once: rare); post: a return at 0x201; no code for the app's main.
        code = {
            "/bin/app": {0x100: "je 0x104", 0x101: "call 0x200", 0x102: "call 0x300",
                         0x103: "mov %rax,%rdi", 0x104: "lock xadd %rax,(%rdi)"},
            "/lib/lib.so": {0x200: "add $1,%rax", 0x201: "ret", 0x300: "pause"},
        }
        k = insns_per_message.kinds(profile(), 4, code_of=lambda o: code.get(o, {}))
        self.assertEqual(k["/bin/app"]["branch"], (1.0, 1))
        self.assertEqual(k["/bin/app"]["call"], (2.0, 2))
        self.assertEqual(k["/bin/app"]["atomic"], (0.25, 0))
        # (sleep's pause ran 10 times in 4 messages: 2.5 idle turns a message, every message)
        self.assertEqual(k["/lib/lib.so"], {"return": (1.0, 1), "pause": (2.5, 1)})
        self.assertNotIn("syscall", k["/bin/app"])

    def test_a_profile_without_instruction_positions_is_refused(self):
        with self.assertRaises(SystemExit):
            profile(PROFILE.replace("positions: instr line", "positions: line"))


if __name__ == "__main__":
    unittest.main()
