"""Tests for specdec_jax.training.loop: resume, records written once, cadence, best/final exports.

A counting model stands in for a network: its one parameter adds the step number at each step,
so the params after any run say exactly which steps it took.
"""

import json
import os
import shutil

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.training import loop as train_loop


@flax.struct.dataclass
class _State:
  step: jax.Array
  params: jax.Array


def _fresh():
  return _State(step=jnp.zeros((), jnp.int32), params=jnp.zeros((), jnp.float32))


class _Counting:
  """Step, evaluation and export of the counting model, recording what the loop called."""

  def __init__(self, evals=None):
    self.steps, self.evaluated, self.evals = [], [], evals

  def step(self, state, step):
    self.steps.append(step)
    params = state.params + step
    return _State(state.step + 1, params), {'loss': params, 'half': params / 2}, {'examples': 4}

  def evaluate(self, params):
    self.evaluated.append(float(params))
    value = self.evals[len(self.evaluated) - 1] if self.evals else float(params)
    return {'valid_score': value}

  def export(self, params, path):  # whole or not at all, as train_loop.ExportFn asks
    os.makedirs(path + '.tmp')
    with open(os.path.join(path + '.tmp', 'params.json'), 'w') as f:
      json.dump(float(params), f)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(path + '.tmp', path)


def _run(workdir, fake, num_train_steps=6, best=train_loop.Best('valid_score'), **kw):
  cadence = train_loop.Cadence(num_train_steps, log_every=2, eval_every=3, checkpoint_every=3)
  return train_loop.run(
    _fresh(),
    fake.step,
    fake.evaluate,
    cadence=cadence,
    workdir=str(workdir),
    export=fake.export,
    best=best,
    **kw,
  )


def _records(workdir):
  with open(workdir / 'metrics.jsonl') as f:
    return [json.loads(line) for line in f]


def _exported(path):
  with open(path / 'params.json') as f:
    return json.load(f)


def test_an_interrupted_run_resumes_at_its_checkpoint_and_writes_each_record_once(tmp_path):
  whole = _Counting()
  result = _run(tmp_path / 'whole', whole, log_extra=lambda step: {'lr': 0.1 * step})
  assert whole.steps == [0, 1, 2, 3, 4, 5] and _exported(tmp_path / 'whole' / 'final') == 15
  assert result['kind'] == 'eval' and result['step'] == 6 and result['valid_score'] == 15
  records = _records(tmp_path / 'whole')
  assert [(r['kind'], r['step']) for r in records] == [
    ('train', 2), ('eval', 3), ('train', 4), ('train', 6), ('eval', 6)
  ]  # fmt: skip
  train = [r for r in records if r['kind'] == 'train']
  # Means over each window of 2 steps (params after steps 1,2: 0,1; 3,4: 3,6; 5,6: 10,15).
  assert [r['loss'] for r in train] == [0.5, 4.5, 12.5] and train[0]['half'] == 0.25
  assert [r['lr'] for r in train] == pytest.approx([0.2, 0.4, 0.6])
  assert all(r['steps_per_second'] > 0 and r['examples_per_second'] > 0 for r in train)

  # Killed after the checkpoint at step 3 (the records of steps 4 and 6 written).
  shutil.copytree(tmp_path / 'whole', tmp_path / 'cut')
  shutil.rmtree(tmp_path / 'cut' / 'checkpoints' / '6')
  resumed = _Counting()
  _run(tmp_path / 'cut', resumed, log_extra=lambda step: {'lr': 0.1 * step})
  assert resumed.steps == [3, 4, 5] and _exported(tmp_path / 'cut' / 'final') == 15
  again = _records(tmp_path / 'cut')
  assert [(r['kind'], r['step']) for r in again] == [(r['kind'], r['step']) for r in records]
  assert [r['loss'] for r in again if r['kind'] == 'train'] == [0.5, 6.0, 12.5]  # 4: one step


def test_a_finished_run_rerun_trains_nothing_and_returns_its_last_eval(tmp_path):
  first = _run(tmp_path, _Counting())
  records = _records(tmp_path)
  rerun = _Counting()
  assert _run(tmp_path, rerun) == first
  assert rerun.steps == [] and rerun.evaluated == [] and _records(tmp_path) == records
  # Asked for more steps, it goes on from the last checkpoint and re-exports final/.
  longer = _Counting()
  _run(tmp_path, longer, num_train_steps=8)
  assert longer.steps == [6, 7] and _exported(tmp_path / 'final') == 28


@pytest.mark.parametrize('higher_is_better', [False, True])
def test_best_is_the_best_evaluation_across_reruns(tmp_path, higher_is_better):
  best = train_loop.Best('valid_score', higher_is_better=higher_is_better)
  _run(tmp_path, _Counting(evals=[5.0, 7.0]), best=best)  # evaluated at steps 3 and 6
  want_step = 6 if higher_is_better else 3
  with open(tmp_path / 'best' / 'best.json') as f:
    assert json.load(f)['step'] == want_step
  assert _exported(tmp_path / 'best') == {3: 3, 6: 15}[want_step]
  # A longer rerun whose evaluation (at 9) is worse than the best so far keeps best/ as it was.
  cadence = train_loop.Cadence(9, log_every=2, eval_every=3, checkpoint_every=3)
  fake = _Counting(evals=[6.0])
  train_loop.run(
    _fresh(), fake.step, fake.evaluate, cadence=cadence, workdir=str(tmp_path),
    export=fake.export, best=best,
  )  # fmt: skip
  with open(tmp_path / 'best' / 'best.json') as f:
    assert json.load(f)['step'] == want_step


def test_evaluate_at_start_evaluates_step_zero_once(tmp_path):
  fake, best = _Counting(evals=[9.0, 1.0, 2.0]), train_loop.Best('valid_score', True)
  _run(tmp_path, fake, evaluate_at_start=True, best=best)
  assert fake.evaluated == [0.0, 3.0, 15.0]
  # The start's evaluation is best unless training beats it.
  assert _exported(tmp_path / 'best') == 0
  shutil.rmtree(tmp_path / 'checkpoints' / '6')
  shutil.rmtree(tmp_path / 'checkpoints' / '3')
  rerun = _Counting(evals=[1.0, 2.0])
  _run(tmp_path, rerun, evaluate_at_start=True, best=best)  # from step 0: its evaluation is on file
  assert rerun.evaluated == [3.0, 15.0]
  evals = [r['step'] for r in _records(tmp_path) if r['kind'] == 'eval']
  assert evals == [0, 3, 6] and _exported(tmp_path / 'best') == 0


def test_bad_settings_raise_naming_the_field(tmp_path):
  with pytest.raises(ValueError, match='eval_every must be >= 1, got 0'):
    train_loop.Cadence(6, log_every=2, eval_every=0, checkpoint_every=3)
  with pytest.raises(ValueError, match='num_train_steps must be >= 0'):
    train_loop.Cadence(-1, log_every=2, eval_every=3, checkpoint_every=3)
  with pytest.raises(ValueError, match='workdir is empty'):
    _run('', _Counting())
  assert np.isinf(train_loop.Best('valid_alpha', higher_is_better=True).worst)
