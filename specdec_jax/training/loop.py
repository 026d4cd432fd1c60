"""The training loop of `training` (teacher-forced) and `distill` (distillation): one copy.

The caller brings the state, a step function, an evaluation and an export; this module owns what
every run does around them, in a workdir a rerun resumes from:

  <workdir>/checkpoints/<step>/  orbax checkpoints of the whole train state (`StandardSave`)
  <workdir>/metrics.jsonl        one JSON record per log window ('kind': 'train') or evaluation
                                 ('kind': 'eval'), each (kind, step) written once
  <workdir>/best/                the export with the best evaluation so far; best.json its record
  <workdir>/final/               the export of the last state

The cadence: a train record every `log_every` steps (means of the step metrics over the window,
steps and counted things per second, eval time left out), a checkpoint every `checkpoint_every`
and an evaluation every `eval_every` steps, all three at the last step too. A rerun restores the
latest checkpoint, drops the records written after it and goes on: the same batches (the step
function reads the step number) give the same updates.

Several processes (a multi-host mesh) run the same loop on the same workdir, a directory they all
see: each writes its own shards of every checkpoint and export (orbax), process 0 alone writes
metrics.jsonl, best.json and the progress lines; every decision (resume step, best so far) reads
the same files or the same replicated values, so all processes take it alike.

Not clu's `metric_writers` / `periodic_actions` (the flax examples'): `clu.metric_writers` imports
TensorFlow on import (its SummaryWriter), and what is needed here is a JSONL file and a modulo.
"""

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from specdec_jax import sharding

# (state, step) -> (new state, metrics: scalars averaged over each log window, counts: host
# numbers summed over it and reported per second, e.g. {'examples': 64, 'tokens': 900.0}).
StepFn = Callable[[Any, int], tuple[Any, dict, dict]]
EvalFn = Callable[[Any], dict]  # params -> {'valid_...': float}
# (params, directory): writes the directory whole or not at all (aside, then renamed into place);
# with several processes every one calls it.
ExportFn = Callable[[Any, str], None]


@dataclasses.dataclass(frozen=True)
class Cadence:
  """How long to train and how often to log, evaluate and checkpoint (in steps)."""

  num_train_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int
  keep_checkpoints: int = 3

  def __post_init__(self):
    if self.num_train_steps < 0:
      raise ValueError(f'num_train_steps must be >= 0, got {self.num_train_steps}')
    for name in ('log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'Cadence':
    """The fields of this class read from a training config."""
    return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls)})

  def due(self, step: int, every: int) -> bool:
    return step % every == 0 or step == self.num_train_steps


@dataclasses.dataclass(frozen=True)
class Best:
  """Which evaluation metric picks `<workdir>/best`, and whether higher is better."""

  metric: str
  higher_is_better: bool = False

  @property
  def worst(self) -> float:
    return -math.inf if self.higher_is_better else math.inf

  def improves(self, value: float, on: float) -> bool:
    return value > on if self.higher_is_better else value < on


class Workdir:
  """The files of one run: checkpoints, metrics.jsonl, best/ and final/ (module docstring)."""

  def __init__(self, path: str, *, keep_checkpoints: int, best: Best, export: ExportFn):
    import orbax.checkpoint as ocp  # slow import, only needed here

    if not path:
      raise ValueError('The workdir is empty: name a directory for checkpoints and metrics.')
    self._ocp = ocp
    os.makedirs(path, exist_ok=True)
    self.metrics_path = os.path.join(path, 'metrics.jsonl')
    self.best_path, self.final_path = os.path.join(path, 'best'), os.path.join(path, 'final')
    self.best, self._export = best, export
    self.manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(path, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep_checkpoints, create=True),
    )
    self.best_value = best.worst
    if os.path.exists(os.path.join(self.best_path, 'best.json')):
      with open(os.path.join(self.best_path, 'best.json')) as f:
        self.best_value = json.load(f)[best.metric]
    self._metrics_file = None

  def restore(self, state):
    """The latest checkpoint restored into `state`'s structure and shardings (`state` itself if
    there is none; a checkpoint written on another mesh or process count comes back on this one);
    drops the metric records written after that checkpoint."""
    latest = self.manager.latest_step()
    if latest is not None:
      target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
      )
      state = self.manager.restore(latest, args=self._ocp.args.StandardRestore(target))
      say(f'resumed from step {int(state.step)}')
    if sharding.is_main_process():
      truncate_records(self.metrics_path, after_step=int(state.step))
      self._metrics_file = open(self.metrics_path, 'a', encoding='utf-8')
    sharding.barrier('train_loop: records truncated')
    return state

  def save(self, step: int, state) -> None:
    self.manager.save(step, args=self._ocp.args.StandardSave(state))

  def wait(self) -> None:
    """Until the checkpoint being written asynchronously is on disk."""
    self.manager.wait_until_finished()

  def log(self, record: dict) -> None:
    if self._metrics_file is not None:  # process 0
      self._metrics_file.write(json.dumps(record) + '\n')
      self._metrics_file.flush()

  def evaluated(self, record: dict, params) -> None:
    """Logs an eval record; exports `params` to best/ (with the record as best.json) if its
    metric beats the best so far."""
    self.log(record)
    value = record[self.best.metric]
    if self.best.improves(value, self.best_value):
      self.best_value = value
      self.export(params, self.best_path)
      if sharding.is_main_process():
        with open(os.path.join(self.best_path, 'best.json'), 'w') as f:
          json.dump(record, f)
      sharding.barrier('train_loop: best.json written')

  def export(self, params, path: str) -> None:
    self._export(params, path)

  def has_final(self) -> bool:
    return os.path.isdir(self.final_path)  # an ExportFn writes it whole or not at all

  def close(self) -> None:
    self.wait()
    self.manager.close()
    if self._metrics_file is not None:
      self._metrics_file.close()


class _Window:
  """Train metrics and counts since the last log line, and the seconds they took."""

  def __init__(self):
    self.pending, self.counts, self.start = [], {}, time.perf_counter()

  def add(self, metrics: dict, counts: dict) -> None:
    self.pending.append(metrics)
    for k, v in counts.items():
      self.counts[k] = self.counts.get(k, 0.0) + float(v)

  def record(self, step: int, extra: dict) -> dict:
    fetched = jax.device_get(self.pending)  # one sync per log window
    seconds = time.perf_counter() - self.start
    return {
      'kind': 'train',
      'step': step,
      **{k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]},
      **extra,
      'steps_per_second': len(fetched) / seconds,
      **{f'{k}_per_second': v / seconds for k, v in self.counts.items()},
    }


def run(
  state,
  train_step: StepFn,
  evaluate: EvalFn,
  *,
  cadence: Cadence,
  workdir: str,
  export: ExportFn,
  best: Best,
  log_extra: Callable[[int], dict] | None = None,
  evaluate_at_start: bool = False,
  progress: str = '',
) -> dict:
  """Trains `state` (a pytree with a `step` and `params`) to `cadence.num_train_steps`, resuming
  from `workdir` if it holds checkpoints (module docstring for the files and the cadence).

  Args:
    state: the initial state: trained from if the workdir has no checkpoint, else the structure
      the latest one is restored into.
    train_step: `StepFn`; it reads its batch from the step number, so a resumed run sees the
      batches the interrupted one would have.
    evaluate: `EvalFn` on the params; the loop adds 'kind', 'step' and 'eval_seconds'.
    export: writes a params pytree to a directory (best/ and final/).
    best: the eval metric that picks best/.
    log_extra: step -> values added to each train record (e.g. the learning rate).
    evaluate_at_start: at step 0, evaluate the initial state first (a run started from a trained
      model: its evaluation is the one to beat).
    progress: a progress bar's description; '' for none. Log lines go above the bar.

  Returns:
    The last evaluation's record (of an earlier run if this one resumed at the last step).
  """
  files = Workdir(workdir, keep_checkpoints=cadence.keep_checkpoints, best=best, export=export)
  state = files.restore(state)
  step = first_step = int(state.step)
  bar = _progress_bar(cadence.num_train_steps, step, progress)

  def run_eval(step):
    start = time.perf_counter()
    record = {'kind': 'eval', 'step': step, **evaluate(state.params)}
    record['eval_seconds'] = time.perf_counter() - start
    say(_eval_line(record), bar)
    files.evaluated(record, state.params)
    return record

  last_eval = {}
  if evaluate_at_start and step == 0:
    last_eval = last_record(files.metrics_path, 'eval', 0) or run_eval(0)
  window = _Window()
  while step < cadence.num_train_steps:
    state, metrics, counts = train_step(state, step)
    step += 1
    bar.update(1)
    window.add(metrics, counts)
    if cadence.due(step, cadence.log_every):
      record = window.record(step, log_extra(step) if log_extra else {})
      say(_train_line(record), bar)
      files.log(record)
      window = _Window()
    if cadence.due(step, cadence.checkpoint_every):
      files.save(step, state)
    if cadence.due(step, cadence.eval_every):
      files.wait()
      last_eval = run_eval(step)
      window.start = time.perf_counter()  # keep eval time out of the throughput
  bar.close()
  files.wait()
  if not last_eval:  # resumed at or past the last step: that run's final evaluation stands
    last_eval = last_record(files.metrics_path, 'eval', step) or run_eval(step)
  if step > first_step or not files.has_final():
    files.export(state.params, files.final_path)
  say(
    f'exported {files.final_path} (step {step}); {files.best_path} has {best.metric} '
    f'{files.best_value:.4f}',
  )
  files.close()
  return last_eval


def _progress_bar(total: int, initial: int, description: str):
  from tqdm.auto import tqdm

  return tqdm(
    total=total,
    initial=initial,
    desc=description,
    disable=not description or not sharding.is_main_process(),
    dynamic_ncols=True,
    mininterval=5.0,
  )


def say(line: str, bar=None) -> None:
  """Prints a log line on process 0 (every process runs the same program), above the progress
  bar if one is shown."""
  if not sharding.is_main_process():
    return
  if bar is None or bar.disable:
    print(line, flush=True)
  else:
    bar.write(line)
    sys.stdout.flush()


def _train_line(record: dict) -> str:
  rates = [k for k in record if k.endswith('_per_second')]
  values = [f'{k} {v:.4g}' for k, v in record.items() if k not in rates + ['kind', 'step']]
  speeds = [f'{_rate(record[k])} {k[: -len("_per_second")]}/s' for k in rates]
  return f'step {record["step"]}: {", ".join(values)} | {", ".join(speeds)}'


def _rate(value: float) -> str:
  return f'{value:,.0f}' if value >= 100 else f'{value:.3g}'


def _eval_line(record: dict) -> str:
  values = [f'{k} {v:.4f}' for k, v in record.items() if k not in ('kind', 'step', 'eval_seconds')]
  return f'eval step {record["step"]}: {", ".join(values)} ({record["eval_seconds"]:.1f} s)'


def truncate_records(path: str, *, after_step: int) -> None:
  """Drops metric records past `after_step` (written after the checkpoint a run resumes from), so
  a resumed run writes each record once."""
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8') as f:
    records = [line for line in f if line.strip() and json.loads(line).get('step', 0) <= after_step]
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(records)


def last_record(path: str, kind: str, step: int) -> dict | None:
  """The last metrics record of `kind` at `step`, if the file has one."""
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    records = [json.loads(line) for line in f if line.strip()]
  found = [r for r in records if r.get('kind') == kind and r.get('step') == step]
  return found[-1] if found else None
