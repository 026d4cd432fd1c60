"""benchmarks/hf_peer.py: a CPU smoke run on the shipped 13.5M pair (rows present, greedy outputs
identical to ours, ratios consistent), a failing method as a row, and the HF models built from our
params (the random-weights path) against `save_hf_t5` + `from_pretrained`."""

import contextlib
import io
import math
import types

import jax
import numpy as np
import pytest
import torch
from absl import flags
from absl.testing import flagsaver

from benchmarks import hf_peer, synthetic
from specdec_jax import checkpoints
from specdec_jax.checkpoints import hf as checkpoints_hf
from specdec_jax.models import t5

_SENTENCES = 2


@pytest.fixture(scope='module')
def rows() -> list[dict]:
  out = io.StringIO()
  threads = torch.get_num_threads()
  with (
    pytest.MonkeyPatch.context() as patch,
    flagsaver.flagsaver(),
    contextlib.redirect_stdout(out),
  ):
    patch.setenv('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')  # main sets it; restored after
    flags.FLAGS(['hf_peer', '--noeigen_dots'])  # this worker's XLA flags stay as they are
    hf_peer.FLAGS.unparse_flags()
    hf_peer.FLAGS(
      [
        'hf_peer',
        '--pretrained=ende',
        '--drafters=small-t5,distilled',
        f'--num_sentences={_SENTENCES}',
        '--max_new_tokens=10',
        '--source_length=48',
        '--nocompile',
        '--torch_threads=1',  # torch's spinning threads would fight the other workers
      ]
    )
    try:
      hf_peer.main(['hf_peer'])
    finally:
      torch.set_num_threads(threads)
  lines = out.getvalue().splitlines()
  assert lines[0].startswith(f'ende: {_SENTENCES} sentences, source 48, up to 10 new tokens')
  start = next(i for i, line in enumerate(lines) if line.startswith('system '))
  assert lines[start].split() == ' '.join(c.title for c in hf_peer.COLUMNS).split()
  parsed = []
  for line in lines[start + 1 :]:
    cells = line.split(maxsplit=len(hf_peer.COLUMNS) - 1)
    parsed.append(dict(zip([c.name for c in hf_peer.COLUMNS], cells + [''])))
  return parsed


def _number(cell: str) -> float:
  value = float(cell.rstrip('x'))
  assert math.isfinite(value) and value > 0, cell
  return value


def test_every_method_has_its_row(rows):
  assert [(r['system'], r['method'], r['drafter']) for r in rows] == [
    ('ours', 'autoregressive', '-'),
    ('ours', 'speculative', 'small-t5'),
    ('ours', 'speculative', 'distilled'),
    ('transformers', 'greedy', '-'),
    ('transformers', 'greedy-static', '-'),
    ('transformers', 'assisted', 'small-t5'),
    ('transformers', 'assisted', 'distilled'),
  ]


def test_greedy_outputs_are_identical_to_ours(rows):
  # Assisted generation is greedy too (rows[5]; it raised in transformers 5.17 on a GPU, and runs
  # on this CPU with the pinned transformers): a failure of it is a failure here.
  for row in rows[:6]:
    assert row['identical'] == f'{_SENTENCES}/{_SENTENCES}', row


def test_ratios_are_those_of_the_speeds(rows):
  ours, hf_greedy = _number(rows[0]['tokens_per_s']), _number(rows[3]['tokens_per_s'])
  for row in rows:
    if row['tokens_per_s'] == '-':
      continue
    speed = _number(row['tokens_per_s'])
    assert _number(row['ms_per_token']) == pytest.approx(1e3 / speed, rel=2e-3, abs=2e-3)
    # Within what printing loses: tokens/s to 0.05 each (a slow row under load reads a few
    # tokens/s, where 0.05 is more than 1%), the ratio to 0.005.
    for cell, base in (('vs_ours', ours), ('vs_hf', hf_greedy)):
      ratio = speed / base
      slack = ratio * (0.05 / speed + 0.05 / base) + 0.006
      assert _number(row[cell]) == pytest.approx(ratio, abs=slack), (cell, row)


def test_a_drafter_over_the_targets_encoder_has_no_hf_row(rows):
  row = rows[6]
  assert row['tokens_per_s'] == row['identical'] == '-'
  assert 'num_encoder_layers=0' in row['note'] and 'no HF equivalent' in row['note']


def test_a_method_that_raises_is_a_row_with_its_error():
  def make():
    def decode_one(i):
      raise TypeError("'NoneType' object is not subscriptable")

    return decode_one

  result = hf_peer.run(hf_peer.Result('transformers', 'assisted', 'small-t5'), make, [0])
  assert result.outputs is None
  assert result.note == "failed: TypeError: 'NoneType' object is not subscriptable"
  good = hf_peer.Result('ours', 'autoregressive', outputs=[[5, 1]], seconds=0.5)
  row = hf_peer.summary_rows([good, result])[1]
  assert row['tokens_per_s'] is None and row['identical'] is None and row['note'] == result.note


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])  # tied and untied output layers
def test_hf_from_params_is_the_exported_model(name, tmp_path):
  model = synthetic.model(t5.CONFIGS[name], dtype='float32', seed=3)
  checkpoints.save_hf_t5(model, tmp_path)
  want = hf_peer.hf_from_directory(tmp_path, device='cpu', dtype='float32').state_dict()
  got = hf_peer.hf_from_params(model, device='cpu', dtype='float32').state_dict()
  assert sorted(got) == sorted(want)
  for key, tensor in want.items():
    torch.testing.assert_close(got[key], tensor, rtol=0, atol=0, msg=key)


def test_hf_from_params_shares_our_weights_without_a_host_copy():
  # bfloat16 as at 11B: every tensor goes from JAX's device to torch's through DLPack, none is
  # read to the host (as `save_hf_t5`'s numpy state dict reads them); a tensor transformers stores
  # as we do is our buffer itself.
  model = synthetic.model(t5.CONFIGS['tiny-v1.1'], dtype='bfloat16', seed=2)
  want = {
    name: torch.from_numpy(np.asarray(array, np.float32)).to(torch.bfloat16)
    for name, array in checkpoints_hf.params_to_hf_state_dict(model.params, model.config).items()
  }
  scale = model.params['decoder']['decoder_norm']['scale']

  def to_host(*args, **kwargs):
    raise AssertionError('a JAX array read to the host')

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(type(scale), '__array__', to_host)
    with pytest.raises(AssertionError, match='read to the host'):  # the patch holds
      np.asarray(scale)
    got = hf_peer.hf_from_params(model, device='cpu', dtype='bfloat16').state_dict()
  assert sorted(want) == sorted(
    set(got) - {'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'}
  )
  for key, tensor in want.items():
    assert got[key].dtype == torch.bfloat16
    torch.testing.assert_close(got[key], tensor, rtol=0, atol=0, msg=key)
  assert got['decoder.final_layer_norm.weight'].data_ptr() == scale.unsafe_buffer_pointer()


def test_our_rows_bring_outputs_to_the_host_before_cutting_them(monkeypatch):
  # A timed pass over sentences of different lengths compiles nothing (hf_peer's timer raises if
  # it does); the old cut, x[0, :n] of the device array, compiles for each new length.
  tokens = jax.numpy.arange(20, dtype=jax.numpy.int32)[None]
  output = lambda n: types.SimpleNamespace(tokens=tokens, lengths=jax.numpy.array([n]))
  outs = [output(n) for n in (3, 5, 7, 4, 6)]
  monkeypatch.setattr(hf_peer.decode, 'generate', lambda *a, **k: outs.pop(0))
  ids = np.zeros((4, 2), np.int32)
  outputs, seconds = hf_peer.timed(
    hf_peer.ours(None, None, ids, ids, gamma=1, max_new_tokens=20), ids
  )
  assert outputs == [list(range(n)) for n in (5, 7, 4, 6)] and seconds > 0

  def old_cut(i):
    out = outs.pop(0)
    return np.asarray(out.tokens[0, : int(out.lengths[0])]).tolist()

  outs += [output(n) for n in (8, 9, 10)]
  with pytest.raises(hf_peer.timing.CompiledWhileTimed):
    hf_peer.timed(old_cut, ids[:2])


def test_random_weights_models_and_sources():
  hf_peer.FLAGS.unparse_flags()
  hf_peer.FLAGS(
    ['hf_peer', '--random_weights', '--target=tiny-v1.1', '--drafters=tiny-v1.0,target']
    + ['--num_sentences=3', '--source_length=5']
  )
  target, found, ids, mask, gamma, label = hf_peer._models_and_sources()
  assert label == 'random tiny-v1.1' and gamma == 4
  assert found['target'] is target and found['tiny-v1.0'].config == t5.CONFIGS['tiny-v1.0']
  assert ids.shape == mask.shape == (3, 5) and mask.all() and (ids >= 2).all()
  hf_peer.FLAGS.unparse_flags()
  hf_peer.FLAGS(['hf_peer', '--random_weights', '--target=t5-small', '--drafters=tiny-v1.0'])
  with pytest.raises(ValueError, match="'tiny-v1.0' does not share the target vocabulary"):
    hf_peer._models_and_sources()
