"""scripts/ship_pretrained.py end to end on a tiny random target: a loadable pair, as stored."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints, pretrained
from tests import helpers

_ROOT = Path(__file__).resolve().parents[1]
_SPM = pretrained.ROOT / 'ende' / 'spm.model'


@helpers.needs_pair('ende')
def test_ship_a_target_only_pair_in_bfloat16(tmp_path):
  data = tmp_path / 'data'
  data.mkdir()
  shutil.copy(_SPM, data / 'spm_ende_8k.model')
  rows = [('The file is saved.', 'Die Datei ist gespeichert.'), ('Click OK.', 'Klicken Sie OK.')]
  for split in ('train', 'test'):
    (data / f'{split}.tsv').write_text(''.join(f'{s}\t{t}\n' for s, t in rows * 3))
  model = helpers.tiny_t5('tiny-v1.1', vocab_size=8000)
  checkpoints.save(model, tmp_path / 'best')
  (tmp_path / 'best' / 'best.json').write_text(
    json.dumps({'step': 7, 'valid_nll': 9.0, 'valid_bleu': 0.0})
  )
  out = tmp_path / 'pair'
  result = subprocess.run(
    [sys.executable, '-m', 'scripts.ship_pretrained', f'--target={tmp_path / "best"}',
     '--drafter=', f'--data_dir={data}', f'--output={out}', '--num_test=4',
     '--storage_dtype=bfloat16', '--train_batch_size=64', '--grown_from=pretrained/ende/target'],
    capture_output=True, text=True, cwd=_ROOT, timeout=300,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-2000:]
  pair = pretrained.load(out)
  assert sorted(pair.drafters) == ['bigram'] and pair.recommended == 'bigram'
  assert len(pair.test_pairs()) == 4
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.params)
  for got, want in zip(jax.tree.leaves(pair.target.params), jax.tree.leaves(rounded)):
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
  card = (out / 'MODEL_CARD.md').read_text()
  assert 'stored as bfloat16' in card and 'train steps (batch 64)' in card
  assert 'The target is `pretrained/ende/target` grown' in card and 'from scratch' not in card
  assert '| target | gated-gelu, untied, d_model 32' in card and '| 7 |' in card


@pytest.mark.slow  # ~30 CPU-s
@helpers.needs_pair('ende')
def test_add_drafter_records_t5_and_ngram_drafters(tmp_path):
  pair_dir = tmp_path / 'pair'
  shutil.copytree(pretrained.ROOT / 'ende', pair_dir, ignore=shutil.ignore_patterns('target'))
  checkpoints.save(helpers.tiny_t5('tiny-v1.1', vocab_size=8000), pair_dir / 'target')
  checkpoints.save(helpers.tiny_t5('tiny-v1.1', seed=1, vocab_size=8000), tmp_path / 'd')

  def add(*args):
    result = subprocess.run(
      [sys.executable, '-m', 'scripts.add_drafter', f'--pair={pair_dir}', *args],
      capture_output=True, text=True, cwd=_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]

  add('--name=mine', f'--source={tmp_path / "d"}', '--recommend', '--gamma=0:2,1:5')
  add('--name=tri', f'--source={pair_dir / "trigram.npz"}')  # already in the pair: kept as it is
  add('--name=trigram', f'--source={pair_dir / "trigram.npz"}')  # the very same file
  pair = pretrained.load(pair_dir)
  assert pair.recommended == 'mine' and pair.gamma(0.0) == 2 and pair.gamma(1.0) == 5
  assert {'mine', 'tri', 'trigram', 'bigram'} <= set(pair.drafters)
  assert (pair_dir / 'trigram.npz').stat().st_size > 0
