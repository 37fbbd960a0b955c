"""Step by key with superqt's GeneratorWorker against kvviz's worker, on the embedded model.

`python docs/measure_worker.py` prints, for each, the token steps computed for 20 presses of Step, the median
time from a press to its record, and the CPU time spent in 2 s while paused. GeneratorWorker steps as
resume-then-pause-at-the-next-yield (it has no "one step" command); kvviz's worker takes one queued Step command
per press. The figures are quoted in kvviz/app/run/worker.py's docstring.
"""

import os
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from superqt.utils import thread_worker  # noqa: E402

from kvviz.app.run.session import RunSession  # noqa: E402
from kvviz.core.records import RunRequest  # noqa: E402
from kvviz.engine.engine import Engine  # noqa: E402
from kvviz.engine.run import start_run  # noqa: E402
from kvviz.sources.weights import load_model  # noqa: E402

PRESSES = 20
app = QApplication([])


def wait(done, timeout=10.0):
    end = time.perf_counter() + timeout
    while not done() and time.perf_counter() < end:
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 1)


def idle_cpu_ms() -> float:
    started = time.process_time()
    time.sleep(2.0)
    return (time.process_time() - started) * 1000


def generator_worker() -> tuple[int, float, float]:
    loaded = load_model(None)
    engine = Engine(loaded.model, loaded.tokenizer)
    engine.warm_up()
    run = start_run(engine, RunRequest(run_id=1, prompt="Time flies", max_new_tokens=200), loaded.name)

    def steps():
        yield from run.token_steps()

    computed, latencies = [], []
    worker = thread_worker(steps, start_thread=False)()
    worker.yielded.connect(lambda step: (computed.append(step), worker.pause()))
    worker.pause()  # paused before its first step
    worker.start()
    wait(lambda: worker.is_paused, 5)
    idle = idle_cpu_ms()
    for _ in range(PRESSES):
        done, pressed = len(computed), time.perf_counter()
        worker.resume()
        wait(lambda done=done: len(computed) > done)
        latencies.append((time.perf_counter() - pressed) * 1000)
        wait(lambda: worker.is_paused, 5)
    worker.quit()
    wait(lambda: not worker.is_running, 5)
    return len(computed), statistics.median(latencies), idle


def kvviz_worker() -> tuple[int, float, float]:
    session = RunSession()
    session.load("")
    wait(lambda: session.model_info is not None, 60)
    session.start_run(RunRequest(run_id=0, prompt="Time flies", max_new_tokens=200))
    wait(lambda: session.plan is not None)
    idle = idle_cpu_ms()
    latencies = []
    for _ in range(PRESSES):
        done, pressed = len(session.records), time.perf_counter()
        session.step()
        wait(lambda done=done: len(session.records) > done)
        latencies.append((time.perf_counter() - pressed) * 1000)
    wait(lambda: False, 0.3)  # anything more would arrive now
    steps = session.steps_done
    session.stop(5000)
    return steps, statistics.median(latencies), idle


for name, measure in (("GeneratorWorker", generator_worker), ("kvviz worker", kvviz_worker)):
    steps, latency, idle = measure()
    print(f"{name:>15}: {steps} token steps for {PRESSES} presses; press to record, median {latency:.1f} ms; "
          f"CPU while paused for 2 s: {idle:.0f} ms")
