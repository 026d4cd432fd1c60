"""Training and distillation on a mesh of 2 processes x 4 CPU devices, against one device.

Two processes join over localhost (`sharding.maybe_initialize_distributed`, gloo collectives),
each with 4 CPU devices, and run `trainer.train_and_evaluate` (the tiny target, its params and
optimizer state sharded over 'model') and then `distill.distill_and_evaluate` (a tiny target
sharded over 'model' and run live in each step, a one-layer student over its encoder
replicated, every other batch the student's own samples) on a global (data=2, model=4) mesh. Each run is interrupted right after its checkpoint at step 2 and rerun, which
resumes there. A third process runs both jobs on one device, uninterrupted. Then:
- every step's losses (metrics.jsonl) and every evaluation agree with the one-device run's
  (float32; only the order of float sums differs), and the target's outputs generated on the
  mesh are the one-device run's;
- every array of the train state lived on all 8 devices at every step (checked in the script),
  the target model's attention kernels split over 'model';
- each record was written once (process 0 alone writes metrics), and the checkpoint the two
  processes wrote restores in this one-device process, equal to the one-device run's;
- the distillation's pair directory loads with `pretrained.load`.
"""

import json
import pathlib

import jax
import numpy as np
import pytest

from specdec_jax import checkpoints, pretrained
from specdec_jax.data import pairs, tokenizer
from specdec_jax.models import t5
from specdec_jax.training import loop as train_loop
from specdec_jax.training import trainer
from tests import helpers

_REPO = pathlib.Path(__file__).resolve().parents[1]

# Three processes each compile a training and a distillation program: 217-257 s of one worker
# on 2 cores of an Intel Xeon @ 2.50GHz (2026-11-27), the default suite's longest item. Run with
# `pytest -m slow`; the default suite keeps the two-process decode (multihost_test) and the
# training and distillation steps compiled for a v4-8 mesh (tpu_compile_test).
pytestmark = pytest.mark.slow

# python script.py PROCESS_ID PORT OUT_DIR DATA_DIR TEACHER (helpers.run_as_two_hosts_and_one).
_SCRIPT = r"""
import sys
pid, port, out, data_dir, teacher = int(sys.argv[1]), *sys.argv[2:6]
multi = pid >= 0
from specdec_jax import sharding
if multi:
  assert sharding.maybe_initialize_distributed(f'localhost:{port}', 2, pid)
import jax
from jax.sharding import PartitionSpec as P
from experiments.configs import distill_drafter, train_target
from specdec_jax.training import distill, loop as train_loop, trainer
assert jax.device_count() == (8 if multi else 1)

def on_every_device(state):
  for path, x in jax.tree_util.tree_leaves_with_path(state):
    assert len(x.sharding.device_set) == jax.device_count(), (jax.tree_util.keystr(path), x.sharding)

run = train_loop.run
def checked_run(state, train_step, *args, **kwargs):  # the state, before and after every step
  on_every_device(state)
  def step(state, i):
    state, metrics, counts = train_step(state, i)
    on_every_device(state)
    return state, metrics, counts
  return run(state, step, *args, **kwargs)
train_loop.run = checked_run

class Interrupted(Exception):
  pass
save, stop_after = train_loop.Workdir.save, {'step': 2 if multi else None}
def save_then_stop(self, step, state):
  save(self, step, state)
  if step == stop_after['step']:
    self.wait()
    raise Interrupted
train_loop.Workdir.save = save_then_stop

def interrupted_and_resumed(job, config, workdir):
  stop_after['step'] = 2 if multi else None
  try:
    job(config, workdir)
    assert not multi, 'not interrupted'
  except Interrupted:
    stop_after['step'] = None
    job(config, workdir)  # resumes from the checkpoint at step 2

mesh = '2x4' if multi else 'auto'
steps = 'num_train_steps=4,log_every=1,checkpoint_every=2,eval_every=4,length_buckets=32'
config = train_target.get_config(
  f'runlocal,data_dir={data_dir},{steps},mesh={mesh},model_sharding=model,model.vocab_size=320')
interrupted_and_resumed(trainer.train_and_evaluate, config, f'{out}/train')
query = trainer.create_state(
  jax.random.key(0), trainer.model_config_from(config),
  trainer.OptimizerConfig.from_config(config), sharding.mesh_from_spec(mesh), 'model',
)[1].params['decoder']['layers_0']['self_attention']['query']['kernel']
assert not multi or query.spec == P(None, 'model'), query  # heads split over model=4

config = distill_drafter.get_config(
  f'runlocal,teacher={teacher},tokenizer={data_dir}/spm_ende_8k.model,'
  f'train_file={data_dir}/train.tsv,valid_file={data_dir}/valid.tsv,test_file=,{steps},'
  f'mesh={mesh},student_sharding=replicated,data_temperatures=0,eval_temperatures=0,'
  # The target runs live in every step, as it would at 11B (its states are not cached), and
  # every other step trains on the student's own samples (on_policy_every=2 of runlocal).
  'cache_teacher=false,'
  'student.d_model=32,student.d_kv=8,student.d_ff=64,num_valid_sources=8')
interrupted_and_resumed(distill.distill_and_evaluate, config, f'{out}/distill')
print('DONE')
"""


def _records(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def _assert_same_records(got: list[dict], want: list[dict], exact: tuple[str, ...]) -> None:
  """The same (kind, step) records, each once; their metrics equal up to float sums' order."""
  assert [(r['kind'], r['step']) for r in got] == [(r['kind'], r['step']) for r in want]
  assert len({(r['kind'], r['step']) for r in got}) == len(got)  # each written once
  for g, w in zip(got, want):
    for key, value in w.items():
      if key in exact:
        assert g[key] == value, (key, g, w)
      elif key not in ('kind', 'step') and 'second' not in key:
        np.testing.assert_allclose(g[key], value, rtol=2e-5, atol=1e-6, err_msg=f'{key} {w}')


def _restore(workdir: pathlib.Path, config: t5.T5Config, optimizer: trainer.OptimizerConfig):
  """The latest checkpoint in `workdir`, restored onto this process's one device."""
  state, _ = trainer.create_state(
    jax.random.key(1), config, optimizer, jax.make_mesh((1, 1), ('data', 'model'))
  )
  files = train_loop.Workdir(
    str(workdir), keep_checkpoints=3, best=train_loop.Best('valid_nll'), export=None
  )
  state = files.restore(state)
  files.close()
  return state


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The jobs run by 2 processes on a 2x4 mesh ('multi') and by one on one device ('one')."""
  tmp = tmp_path_factory.mktemp('multihost_training')
  data = tmp / 'data'
  data.mkdir()
  train, valid = helpers.fixture_pairs(200, seed=0), helpers.fixture_pairs(16, seed=1)
  pairs.write_tsv(train, data / 'train.tsv')
  pairs.write_tsv(valid, data / 'valid.tsv')
  tok = tokenizer.train_tokenizer([s for p in train for s in p], vocab_size=320)
  tok.save(data / 'spm_ende_8k.model')
  # The target of the distillation: one layer a side, its next-token laws peaked (a random T5
  # spreads its mass almost evenly: sums in another order over 'model' shards would then move
  # an argmax now and then, and the target's outputs differ between the meshes).
  teacher = helpers.tiny_t5(
    'tiny-v1.1', seed=2, vocab_size=320, num_encoder_layers=1, num_decoder_layers=1
  )
  params = jax.tree.map(np.array, teacher.params)
  params['decoder']['logits_dense']['kernel'] *= 30.0
  checkpoints.save(t5.T5Model(config=teacher.config, params=params), tmp / 'teacher')

  helpers.run_as_two_hosts_and_one(_SCRIPT, tmp, str(data), str(tmp / 'teacher'))
  return tmp


def test_training_on_two_processes_equals_one_device(runs):
  got, want = (_records(runs / run / 'train' / 'metrics.jsonl') for run in ('multi', 'one'))
  assert [r['step'] for r in want if r['kind'] == 'train'] == [1, 2, 3, 4]
  _assert_same_records(got, want, exact=('valid_bleu',))
  # The model it exported reads back; the params equal the one-device run's.
  a, b = (checkpoints.restore(runs / run / 'train' / 'final') for run in ('multi', 'one'))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_two_processes_restores_in_one(runs):
  from experiments.configs import train_target

  config = train_target.get_config('runlocal,num_train_steps=4,model.vocab_size=320')
  model_config = trainer.model_config_from(config)
  optimizer = trainer.OptimizerConfig.from_config(config)
  multi, one = (_restore(runs / run / 'train', model_config, optimizer) for run in ('multi', 'one'))
  assert int(multi.step) == int(one.step) == 4
  for x, y in zip(jax.tree.leaves(multi), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_distillation_on_two_processes_equals_one_device(runs):
  # The target's greedy outputs, generated by the sharded decode loop, written once.
  for shard in ('data_t0', 'valid_t0'):
    files = [sorted((runs / run / 'distill' / shard).glob('*.npz')) for run in ('multi', 'one')]
    assert len(files[0]) == len(files[1]) > 0
    for a, b in zip(*files):
      with np.load(a) as x, np.load(b) as y:
        np.testing.assert_array_equal(x['tokens'], y['tokens'])
  got, want = (_records(runs / run / 'distill' / 'metrics.jsonl') for run in ('multi', 'one'))
  assert [r['step'] for r in want if r['kind'] == 'train'] == [1, 2, 3, 4]
  _assert_same_records(got, want, exact=('valid_alpha_t0', 'valid_alpha'))
  # The pair directory the run wrote: the target and the best drafter, ready for the main job.
  pair = pretrained.load(runs / 'multi' / 'distill' / 'pair')
  assert pair.recommended == 'distilled' and pair.drafter.config.num_encoder_layers == 0
  assert pair.target.config.vocab_size == pair.drafter.config.vocab_size == 320
