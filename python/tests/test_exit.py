# The interpreter's exit while a daemon thread is inside a long segtape call.
# CPython 3.11 ends such a thread with pthread_exit when it takes the GIL
# again during finalization; the forced unwind cannot pass a nanobind call,
# so a thread inside Trainer.run_segment with a Python env, Trainer.evaluate
# or retention.run ended the process with std::terminate (rc 134) or a
# segfault. segtape's atexit handler refuses such calls from then on, stops
# the running ones at their next boundary and waits for them. Each case runs
# in a child process; an object whose __del__ sleeps during finalization, held
# by a module of its own (the daemon thread's frames keep __main__'s globals
# alive), keeps the window open where the daemon thread takes the GIL again,
# so each case crashed every time before the handler.
import os
import subprocess
import sys
import textwrap

import pytest

PYTHON_ENV = """
    import numpy as np, segtape, segtape.gym as sg
    A = segtape._segtape.agent
    class Env:
        def __init__(self, b, s): self.b = b
        def observe(self): return np.zeros((self.b, 3), np.float32)
        def step(self, a):
            sum(range(2000))  # Python code: the GIL is dropped and taken again in here
            return np.ones(self.b, np.float32), np.zeros(self.b, np.uint8), np.zeros(self.b, np.uint8)
    sg._factories["exit.env"] = Env
    A.register_python_env("exit.env", 3, 0, 4)
    c = A.TrainConfig()
    c.env, c.batch, c.hidden, c.embed, c.steps, c.history = "exit.env", 4, 8, 4, 10**8, "tbptt:4"
    tr = A.Trainer(c)
"""

CASES = {
    "run_segment_python_env": PYTHON_ENV + """
    def work():
        while True:
            tr.run_segment()
    """,
    "evaluate_python_env": PYTHON_ENV + """
    def work():
        tr.evaluate(10**9, 1)  # hours: stopped at its next segment
    """,
    "retention_run": """
    from segtape import retention
    def work():
        retention.run(["tbptt", "1", "2", "3"], steps=20000)  # minutes
    """,
}

MAIN = """
    import os, sys, threading, time, types
    started = threading.Event()
    def thread():
        started.set()
        work()
    threading.Thread(target=thread, daemon=True).start()
    started.wait()
    time.sleep(0.5)  # well inside the call
    class SlowExit:
        def __del__(self, sleep=time.sleep, write=os.write):
            write(1, b"finalizing\\n")
            sleep(1.0)  # the GIL released: the daemon thread may take it
    slow = types.ModuleType("slow_exit")
    slow.keeper = SlowExit()
    sys.modules["slow_exit"] = slow
    del slow
    print("main thread exits", flush=True)
"""


def run_child(code):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_daemon_thread_in_a_long_call_does_not_crash_the_exit(case):
    p = run_child(CASES[case] + MAIN)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-3000:])
    assert p.stdout.split() == ["main", "thread", "exits", "finalizing"]  # (the window was open)
    assert "terminate called" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr[-3000:]
    assert "still running" not in p.stderr, p.stderr[-3000:]  # it stopped within the wait


def test_calls_after_the_exit_handler_are_refused_by_name():
    p = run_child(PYTHON_ENV + """
    from segtape import retention
    assert segtape._C._at_exit(0.0) == 0  # what the atexit handler runs
    for name, call in (("Trainer.run_segment", tr.run_segment), ("Trainer.evaluate", lambda: tr.evaluate(8, 1)),
                       ("Trainer()", lambda: A.Trainer(c)), ("retention.run", lambda: retention.run(["tbptt"]))):
        try:
            call()
            print(name, "ran")
        except RuntimeError as e:
            assert not isinstance(e, segtape.Error), e
            print(e)
    """)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"segtape: the interpreter is exiting; {name} refused"
                                     for name in ("Trainer.run_segment", "Trainer.evaluate", "Trainer()", "retention.run")]


# A call still running when the wait ends (a Python env's step() sleeping
# past it, then taking the GIL again during finalization): finalization ended
# its thread inside the call (std::terminate, rc -6, in 3 of 3 runs of this
# case with the handler that only reported it); the handler ends the process
# itself, with status 1 and a message. The main thread exits just after the
# sleep began, so the call outlasts the 0.2 s wait every time.
def test_a_call_still_running_after_the_wait_ends_the_process_cleanly():
    code = PYTHON_ENV.replace("sum(range(2000))", "inside.set(); __import__('time').sleep(0.5)").replace(
        "import numpy as np,", "import threading; inside = threading.Event()\n    import numpy as np,") + """
    segtape._EXIT_WAIT_SECONDS = 0.2
    def work():
        while True:
            tr.run_segment()
    """ + MAIN.replace("time.sleep(0.5)  # well inside the call", "inside.wait()  # inside step()'s sleep")
    for _ in range(3):
        p = run_child(code)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr[-3000:])
        assert "main thread exits" in p.stdout
        assert "1 call(s) in daemon threads still running 0.2 s after the interpreter began to exit; the process ends now " \
               "with status 1" in p.stderr, p.stderr[-3000:]
        assert "terminate called" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr[-3000:]
