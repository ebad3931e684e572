"""Where a run's wall time goes: one clock that is always in exactly one activity, so the parts add up to the whole.

The harness switches the clock as the host moves through a step: waiting for the next batch (`data_wait`),
dispatching the jitted step (`dispatch`: JAX returns once the step is queued), waiting for the device
(`device`), saving a checkpoint (`checkpoint`), evaluating, and compiling (a start's first step). The host never
blocks on the device to measure it: it waits where it already would, on the step `train.max_steps_ahead` back
(harness.StepsAhead) and on the metrics it reads at a logging step, so the pipeline stays asynchronous; what the
host waits there is the device's time that the host could not hide behind its own work.

Two readers: a logged row's `time/*` keys (seconds per step, averaged over the steps since the last row, so
they add up to `perf/step_time_s` but for the host's own work in the loop: metrics, logs, the profiler; a start's
first row adds `time/compile_s`), and the run's goodput record (bert_jax/run/goodput.py), which takes the totals.
"""
import collections
import contextlib
import time

# The activities a logged row reports, per step: its `time/<name>_s` keys (docs/design.md, metric keys).
ROW_ACTIVITIES = ("data_wait", "dispatch", "device", "checkpoint")
# A row says so in one line when waiting for data took more than this share of the wall time since the last row.
DATA_BOUND_SHARE = 0.2


class StepClock:
    """Seconds per activity since `origin` (time.time()): `totals` over the whole span, `window` since the last
    logged row. The activity before anything is switched is `first`."""

    def __init__(self, first: str, origin: float | None = None):
        self.wall_origin = time.time() if origin is None else origin
        # perf_counter for the intervals; the time before this object existed is the first activity's.
        self._last = time.perf_counter() - max(time.time() - self.wall_origin, 0.0)
        self.activity = first
        self.totals: dict[str, float] = collections.defaultdict(float)
        self.window: dict[str, float] = collections.defaultdict(float)
        self._window_start = time.perf_counter()

    def switch(self, activity: str) -> str:
        """Charges the time since the last switch to the current activity, then runs `activity`; returns the one it
        interrupted."""
        now = time.perf_counter()
        elapsed = now - self._last
        self.totals[self.activity] += elapsed
        self.window[self.activity] += elapsed
        self._last, previous, self.activity = now, self.activity, activity
        return previous

    @contextlib.contextmanager
    def timing(self, activity: str):
        """`activity` for the block, then back to what ran before."""
        previous = self.switch(activity)
        try:
            yield
        finally:
            self.switch(previous)

    def elapsed(self) -> float:
        """Seconds since the origin, every activity's so far included."""
        self.switch(self.activity)
        return sum(self.totals.values())

    def window_row(self, steps: int) -> tuple[dict, float]:
        """The `time/<activity>_s` keys, seconds per step over the `steps` since the last row, and the share of the
        window's wall time (evaluation left out) spent waiting for data; starts the next window."""
        self.switch(self.activity)
        steps = max(steps, 1)
        row = {f"time/{name}_s": self.window.get(name, 0.0) / steps for name in ROW_ACTIVITIES}
        if self.window.get("compile"):  # a start's first row: its first step, compiled and run whole
            row["time/compile_s"] = self.window["compile"] / steps
        wall = time.perf_counter() - self._window_start - self.window.get("evaluation", 0.0)
        share = self.window.get("data_wait", 0.0) / wall if wall > 0 else 0.0
        self.window.clear()
        self._window_start = time.perf_counter()
        return row, share
