"""Time limits on reward calls: off the main thread, in worker processes, and inside daemonic processes.

math-verify's own ``signal.alarm`` timeout fails off the main thread; ours must not.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
import subprocess
import sys
import threading
import time

import pytest
from slow_funcs import (
    exit_on_marker,
    raise_on_marker,
    regex_bomb_on_marker,
    score_in_child,
    spin_for_seconds,
    spin_on_marker,
    swallow_one_interrupt_on_marker,
)

from grpolab.verifiers import timeout
from grpolab.verifiers.math import MathVerifier
from grpolab.verifiers.reward import Verifier


def _in_thread(fn):
    """Run ``fn`` in a non-main thread and return its result (re-raising its exception)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join(120)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _reward_threads_alive(ignore: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "grpolab-reward" and t.is_alive() and t not in ignore]


def _wait_no_reward_threads(before: frozenset[threading.Thread], limit_s: float = 5.0) -> bool:
    """True once every scoring thread started after ``before`` (the ones alive when the test began) has ended
    within ``limit_s``. Threads left by earlier tests in this xdist worker are not this test's (a cut thread lives on
    until its current C call returns): counting them failed this test twice in the suite under load, never alone."""
    deadline = time.monotonic() + limit_s
    while _reward_threads_alive(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _reward_threads_alive(before)


# ------------------------------------------------------------------------------ watchdog thread (0 workers)
def test_thread_watchdog_cuts_a_python_hang_off_the_main_thread():
    rm = Verifier({"slow": spin_on_marker}, timeout_s=0.5, num_workers=0)
    before, start = frozenset(_reward_threads_alive()), time.perf_counter()
    out = _in_thread(lambda: rm(["ok", "HANG", "ok", "ok"], answer=["1"] * 4))
    assert time.perf_counter() - start < 5.0
    assert out.rewards == [1.0, None, 1.0, 1.0]
    assert out.per_func["slow"] == [1.0, None, 1.0, 1.0]
    assert (out.num_timeouts, out.num_unscorable) == (1, 1)
    assert _wait_no_reward_threads(before), "the abandoned scoring thread kept running"


def test_thread_watchdog_interrupts_again_when_code_swallows_the_first_interrupt():
    """An interrupt that lands under a bare ``except:`` is lost (mpmath has several, around calls); left at one
    interrupt, the cut call spins on for 60 s. The watchdog interrupts again until the thread has stopped."""
    rm = Verifier({"slow": swallow_one_interrupt_on_marker}, timeout_s=0.5, num_workers=0)
    before = frozenset(_reward_threads_alive())
    out = _in_thread(lambda: rm(["ok", "HANG", "ok"], answer=["1"] * 3))
    assert out.rewards == [1.0, None, 1.0] and out.num_timeouts == 1
    cut = [t for t in threading.enumerate() if t.name == "grpolab-reward" and t not in before]
    ended, spent = _cpu_until_the_new_threads_end(before, 60.0)
    assert ended and spent < 5.0, f"the cut call ran on: {spent:.1f} CPU s after the cut (ended: {ended})"
    interrupts = [t.num_interrupts for t in cut if t.num_interrupts]
    assert len(interrupts) == 1 and interrupts[0] >= 2  # the swallowed one, then one (or, if starved, more) that stopped it


def test_no_interrupt_escapes_a_scoring_thread(monkeypatch):
    """Interrupts issued back to back, with the threads taking turns at nearly every bytecode, into scoring threads
    cut inside their call, as it ends, or after it: each thread stops inside its own code and none raises past it
    (no thread exception, no unraisable one), because no interrupt is issued after a thread's stop and any pending
    one is cleared there."""
    escaped = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(repr(args.exc_value)))
    monkeypatch.setattr(sys, "unraisablehook", lambda u: escaped.append(repr(u.exc_value)))
    issued, switch = 0, sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(24):
            item = ("slow", (["0.05"],), {"answer": ["1"]})
            thread = timeout._ScoringThread({"slow": spin_for_seconds}, [item], 0)
            thread.start()
            time.sleep(0.01 * (trial % 7))  # 0 to 60 ms: inside the 50 ms call, at its end, after it
            while thread.interrupt():
                pass
            thread.join(10)
            assert not thread.is_alive()
            issued += thread.num_interrupts
    finally:
        sys.setswitchinterval(switch)
    assert escaped == []
    assert issued >= 12  # interrupts were issued into running threads, not only into ended ones


def test_thread_watchdog_cuts_a_slow_math_verify_comparison():
    """A real pathological answer: sympy needs ~20 s to compare (x+1)^1000 with 5 (pure Python)."""
    rm = Verifier({"math": MathVerifier()}, timeout_s=1.0, num_workers=0)
    before, start = frozenset(_reward_threads_alive()), time.perf_counter()
    out = _in_thread(lambda: rm([r"$\boxed{(x+1)^{1000}}$", r"$\boxed{5}$"], answer=["5", "5"]))
    assert time.perf_counter() - start < 8.0
    assert out.rewards == [None, 1.0]
    assert out.num_timeouts == 1
    # the cut lands at sympy's next bytecode; left running the comparison takes ~20 s of CPU more. Judged by the CPU
    # this process spends until the thread ends, not by the wall clock: under load (4.6 on 2 cores, the suite beside
    # a training grid) the thread got too little CPU to reach its next bytecode within 10 s of wall time once
    ended, spent = _cpu_until_the_new_threads_end(before, 120.0)
    assert ended and spent < 5.0, f"the abandoned comparison ran on: {spent:.1f} CPU s after the cut (ended: {ended})"


def _cpu_until_the_new_threads_end(before: frozenset[threading.Thread], limit_s: float) -> tuple[bool, float]:
    """Wait (at most ``limit_s`` of wall time) until the scoring threads started after ``before`` end; return whether
    they did and the most CPU seconds one of them spent from now until its last reading (its own CPU clock, so a
    thread another test left running is not counted)."""
    clocks = {t: time.pthread_getcpuclockid(t.ident) for t in _reward_threads_alive(before)}
    first, last = {}, {}
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for t, clock in clocks.items():
            if t.is_alive():
                try:
                    last[t] = time.clock_gettime(clock)
                except OSError:  # ended between the check and the read
                    continue
                first.setdefault(t, last[t])
        if not _reward_threads_alive(before):
            break
        time.sleep(0.05)
    spent = max((last[t] - first[t] for t in last), default=0.0)
    return not _reward_threads_alive(before), spent


# The first calls of a fresh process that has just built (or, like a reward worker, unpickled) a MathVerifier:
# regexes compiled during each call (math-verify compiles its extraction regexes on first use).
_FIRST_CALLS = r"""
import json, pickle, re, sys
sys.path[:] = json.loads(sys.argv[1])
if sys.argv[2] == "built":
    from grpolab.verifiers.math import MathVerifier
    verifier = MathVerifier()
else:
    verifier = pickle.loads(sys.stdin.buffer.read())
compiler = getattr(re, "_compiler", None) or __import__("sre_compile")
compile_pattern, compiled = compiler.compile, []
compiler.compile = lambda *args: compiled.append(args[0]) or compile_pattern(*args)
out = []
for completion, gold in [(r"$\boxed{5}$", "5"), (r"$\boxed{\frac{3}{4}}$", "0.75"), ("so it is 7/8", r"\frac78")]:
    del compiled[:]
    out.append([completion, verifier([completion], answer=[gold]), len(compiled)])
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["built", "unpickled"])
def test_math_verify_set_up_is_paid_before_the_first_timed_call(how):
    """math-verify's one-time set-up (its extraction regexes, compiled on first use: 0.1 s of CPU, seconds under
    load) happens when a MathVerifier is built or unpickled (a reward worker, while it starts), not inside the
    first reward call, which runs under the per-call time limit: under load it cut that call's plain answer
    (the slow-comparison test above failed so, [None, None])."""
    blob = pickle.dumps(MathVerifier()) if how == "unpickled" else b""
    proc = subprocess.run([sys.executable, "-c", _FIRST_CALLS, json.dumps(sys.path), how], input=blob,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    for completion, rewards, regexes_compiled in json.loads(proc.stdout):
        assert (completion, rewards, regexes_compiled) == (completion, [1.0], 0)


# ----------------------------------------------------------------------------------------- worker processes
def test_worker_processes_cut_a_hang_inside_c_code_and_recover():
    """A regex bomb holds the GIL inside C: no thread can interrupt it, killing the worker can."""
    rm = Verifier({"slow": regex_bomb_on_marker}, timeout_s=1.0, num_workers=1)
    try:
        rm(["warm-up"], answer=["1"])  # start the worker outside the timed part
        start = time.perf_counter()
        out = _in_thread(lambda: rm(["ok", "HANG", "ok", "ok"], answer=["1"] * 4))
        assert time.perf_counter() - start < 10.0
        assert out.rewards == [1.0, None, 1.0, 1.0]
        assert out.num_timeouts == 1
        assert rm._pool.num_restarts == 1
        assert rm(["ok", "ok"], answer=["1", "1"]).rewards == [1.0, 1.0]  # the replacement works
    finally:
        rm.close()


def test_a_dying_worker_is_counted_and_replaced():
    rm = Verifier({"die": exit_on_marker}, timeout_s=10.0, num_workers=1)
    try:
        out = rm(["ok", "DIE", "ok"], answer=["1"] * 3)
        assert out.rewards == [1.0, None, 1.0]
        assert (out.num_crashed, out.num_timeouts, out.num_unscorable) == (1, 0, 1)
    finally:
        rm.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_raising_reward_function_is_an_error_naming_it(num_workers):
    rm = Verifier({"buggy": raise_on_marker}, timeout_s=10.0, num_workers=num_workers)
    try:
        with pytest.raises(RuntimeError, match=r"'buggy' raised on completion 1:(.|\n)*ZeroDivisionError"):
            rm(["ok", "BUG"], answer=["1", "1"])
    finally:
        rm.close()


@pytest.mark.parametrize("num_workers", [0, 1])
def test_time_limit_works_inside_a_daemonic_worker_process(num_workers):
    """multiprocessing.Pool workers are daemonic (like DataLoader workers): they may not start
    multiprocessing children, and signals are not an option; both of our mechanisms still work there."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        rewards, num_timeouts = pool.apply(score_in_child, (num_workers,))
    assert rewards == [1.0, None, 1.0]
    assert num_timeouts == 1


def test_unpicklable_functions_are_refused_for_workers():
    with pytest.raises(TypeError, match="picklable"):
        Verifier({"f": lambda completions, **kw: [1.0] * len(completions)}, num_workers=1)
