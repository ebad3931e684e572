"""A profiler window by config: a `jax.profiler` trace of `train.profile.num_steps` steps from
`train.profile.start_step`, written under DIR/profile/ for XProf (or TensorBoard's profile plugin) to open.

As MaxText's `profiler` / `skip_first_n_steps_for_profiler` / `profiler_steps`: a window after the first steps (whose
compile would fill the trace) and short, since a trace holds every op of every step. Each traced step is wrapped in
`jax.profiler.StepTraceAnnotation("train", step_num=step)`, so XProf's step views find the steps. The trace ends
once the device has finished the window's last step (the host runs ahead of it, bert_jax/run/harness.py).
With num_steps 0 (the default) nothing here runs: no annotation, no trace.

A bucket workdir: the profiler writes to local disk, and the files are copied to DIR/profile/ when the window ends
(an object store takes whole files). `hosts`: `first` traces process 0 only, `all` every process (each writes its
own `<host>.xplane.pb` in the same run folder).
"""
import contextlib
import pathlib
import tempfile

import jax
import ml_collections
from absl import logging

from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

HOSTS = ("first", "all")
STEP_NAME = "train"  # the StepTraceAnnotation name XProf shows for each step
_traced: set[tuple[int, int]] = set()  # windows this process traced (a staged run's later stages say nothing of them)


def check(profile_cfg, num_steps: int | None, prefix: str = "config.train.profile") -> None:
    """The window's keys; `num_steps`: the run's last step, when known before it starts (a window past it is
    refused). Raises ValueError naming the key."""
    if profile_cfg.hosts not in HOSTS:
        raise ValueError(f"{prefix}.hosts={profile_cfg.hosts!r}; expected one of {HOSTS}")
    if profile_cfg.num_steps < 0:
        raise ValueError(f"{prefix}.num_steps={profile_cfg.num_steps} must be >= 0 (0: no trace)")
    if profile_cfg.num_steps == 0:
        return
    if profile_cfg.start_step < 1:
        raise ValueError(f"{prefix}.start_step={profile_cfg.start_step} must be >= 1 (steps count from 1; skip the "
                         "first few, whose compile would fill the trace)")
    end = profile_cfg.start_step + profile_cfg.num_steps - 1
    if num_steps is not None and end > num_steps:
        raise ValueError(f"{prefix}.start_step={profile_cfg.start_step} with num_steps={profile_cfg.num_steps} "
                         f"traces to step {end}, past the run's last step {num_steps}: start it by step "
                         f"{max(num_steps - profile_cfg.num_steps + 1, 1)}")


class ProfileWindow:
    """The window over this start's steps: `annotate(step)` around each step's dispatch, `after_step(step, out)`
    once it is dispatched, `close()` on any exit."""

    def __init__(self, profile_cfg, workdir: str, start: int, last_step: int):
        """`profile_cfg`: config.train.profile, or None (a fine-tuning config has none): no window."""
        if profile_cfg is None:
            profile_cfg = ml_collections.ConfigDict(dict(start_step=0, num_steps=0, hosts=HOSTS[0]))
        self.first = profile_cfg.start_step
        self.last = profile_cfg.start_step + profile_cfg.num_steps - 1
        self.target = Workdir(workdir).profile
        self.local = None  # the folder being traced into, while a trace runs
        on = profile_cfg.num_steps > 0 and (profile_cfg.hosts == "all" or jax.process_index() == 0)
        self.enabled = on and start < self.last and self.first <= last_step
        if on and start >= self.last and (self.first, self.last) not in _traced:  # (a stage after the window's: said)
            logging.warning("config.train.profile traces steps %d to %d, but this run resumes at step %d: no trace "
                            "(set config.train.profile.start_step past %d for one)", self.first, self.last, start,
                            start)
        elif self.enabled and self.last > last_step:
            logging.info("config.train.profile's window (steps %d to %d) goes past step %d, where this run (or its "
                         "stage) stops: traced to step %d", self.first, self.last, last_step, last_step)
        elif self.enabled and start >= self.first:
            logging.info("the profiler window (steps %d to %d) began before this resume at step %d: tracing steps "
                         "%d to %d", self.first, self.last, start, start + 1, self.last)

    def annotate(self, step: int):
        """Starts the trace at the window's first step; the step's annotation while one runs."""
        if not self.enabled or not self.first <= step <= self.last:
            return contextlib.nullcontext()
        if self.local is None:
            self.local = self.target if not paths.is_remote(self.target) else pathlib.Path(
                tempfile.mkdtemp(prefix="bert_jax_profile_"))  # local disk, ours: copied to the bucket at the end
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0  # every Python call of every thread (the loader's too): 10x the bytes
            jax.profiler.start_trace(str(self.local), profiler_options=options)
        return jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step)

    def after_step(self, step: int, outputs) -> None:
        """At the window's last step: waits for the device to finish it, then ends the trace."""
        if self.local is not None and step >= self.last:
            jax.block_until_ready(outputs)
            self.close()

    def close(self) -> None:
        """Ends a running trace (the window's end, or the run stopped inside it) and puts the files in place."""
        if self.local is None:
            return
        jax.profiler.stop_trace()
        _traced.add((self.first, self.last))
        local, self.local, self.enabled = self.local, None, False
        if local != self.target:
            for file in sorted(local.rglob("*")):
                if file.is_file():
                    paths.copy_file(file, self.target / file.relative_to(local).as_posix())
            for file in sorted(local.rglob("*"), reverse=True):  # files before their folders
                file.unlink() if file.is_file() else file.rmdir()
            local.rmdir()
        logging.info("profile of steps %d to %d written to %s; open it with `xprof server --logdir=%s` (pip "
                     "install xprof), or `tensorboard --logdir=%s` with tensorboard-plugin-profile (its Profile tab)",
                     self.first, self.last, self.target, self.target, self.target)
