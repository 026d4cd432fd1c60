"""The main job's runlocal variant, end to end on the shipped pair."""

import json
import pathlib

import pytest

from experiments import translate
from experiments.configs import ende
from specdec_jax import evaluation

_SHIPPED = pathlib.Path(ende.get_config().target)


@pytest.mark.skipif(not _SHIPPED.exists(), reason='pretrained/ende not shipped in this checkout')
def test_runlocal_end_to_end(tmp_path):
  config = ende.get_config('runlocal')
  config.num_examples = 4
  rows = evaluation.run(config)
  methods = {(r['drafter'], r['method'], r['temp']) for r in rows}
  assert ('-', 'autoregressive', 0.0) in methods and ('small-t5', 'block', 1.0) in methods
  assert len(rows) == 2 * (1 + len(config.drafters) * len(config.verifiers))
  for row in rows:
    assert row['seconds'] > 0 and row['tokens_per_s'] > 0
    if row['method'] != 'autoregressive':
      assert 0 <= row['alpha'] <= 1 and 1 <= row['block_efficiency'] <= config.gammas[0] + 1
  # Greedy speculative decoding is lossless token for token: same BLEU as greedy autoregressive.
  greedy_bleu = {r['bleu'] for r in rows if r['temp'] == 0.0}
  assert len(greedy_bleu) == 1
  paths = evaluation.write_results(rows, str(tmp_path))
  assert len(json.loads(pathlib.Path(paths['json']).read_text())) == len(rows)
  assert pathlib.Path(paths['png']).stat().st_size > 0
  assert 'speedup' in evaluation.format_table(rows)


def test_config_overrides():
  config = ende.get_config('runlocal,gammas=3-5,batch_size=8')
  assert config.gammas == (3, 5) and config.batch_size == 8 and config.num_examples == 16
  with pytest.raises(ValueError, match='Unknown config key'):
    ende.get_config('gama=3')
  assert translate.main  # the absl main imports
