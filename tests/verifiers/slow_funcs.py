"""Reward functions that hang, crash or raise, for the time-limit tests.

A plain module (stdlib imports only) so worker processes, which import it to unpickle the functions,
start fast.
"""

from __future__ import annotations

import os
import re
import time


def spin_on_marker(completions, **kwargs):
    """A pure-Python infinite loop for completions containing HANG (interruptible at bytecode level)."""
    out = []
    for c in completions:
        while "HANG" in c:
            pass
        out.append(1.0)
    return out


def swallow_one_interrupt_on_marker(completions, **kwargs):
    """For completions containing HANG, spin in pure Python for 60 s, swallowing the first exception raised into
    the loop, as a bare ``except:`` around a call does (mpmath has several): a single interrupt is lost there."""
    out = []
    for c in completions:
        if "HANG" in c:
            deadline, swallowed = time.monotonic() + 60.0, False
            while time.monotonic() < deadline:
                try:
                    while time.monotonic() < deadline:
                        pass
                except BaseException:  # noqa: BLE001 - what the test is about
                    if swallowed:
                        raise
                    swallowed = True
        out.append(1.0)
    return out


def spin_for_seconds(completions, **kwargs):
    """Spin in pure Python for the number of seconds each completion holds (``"0.05"``), then score 1.0."""
    out = []
    for c in completions:
        deadline = time.monotonic() + float(c)
        while time.monotonic() < deadline:
            pass
        out.append(1.0)
    return out


def regex_bomb_on_marker(completions, **kwargs):
    """Catastrophic backtracking inside the C regex engine, which holds the GIL: only a process kill
    can stop it (2**60 steps)."""
    out = []
    for c in completions:
        if "HANG" in c:
            re.match(r"(a+)+$", "a" * 60 + "b")
        out.append(1.0)
    return out


def exit_on_marker(completions, **kwargs):
    """Kill the process it runs in (a worker dying, e.g. out of memory)."""
    if any("DIE" in c for c in completions):
        os._exit(3)
    return [1.0] * len(completions)


def raise_on_marker(completions, **kwargs):
    """A buggy reward function."""
    if any("BUG" in c for c in completions):
        raise ZeroDivisionError("bug in a reward function")
    return [1.0] * len(completions)


def score_in_child(num_workers: int):
    """Run a Verifier with a hanging call from inside a (daemonic) multiprocessing worker."""
    from grpolab.verifiers.reward import Verifier

    func = spin_on_marker if num_workers == 0 else regex_bomb_on_marker
    rm = Verifier({"slow": func}, timeout_s=1.0, num_workers=num_workers)
    try:
        out = rm(["ok", "HANG", "ok"], answer=["1", "1", "1"])
    finally:
        rm.close()
    return out.rewards, out.num_timeouts
