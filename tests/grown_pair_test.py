"""The main job with a grown target (`config.grow_to`, `pretrained.grow_pair`): the shipped 13.5M
pair's target grown to t5_1_1-small shapes decodes its test sentences as the shipped target does,
its distilled drafter following the grown encoder; bad growths fail before decoding."""

import numpy as np
import pytest

from experiments.configs import debsumm, ende
from specdec_jax import pretrained
from specdec_jax.measure import evaluation, job_config, timing, translation
from specdec_jax.sampling import SamplingConfig
from tests import helpers


def _fake_step_costs(target, drafter, **kw):
  return dict(c=0.05, c_fixed=0.0, c_alone=0.05, pass_cost=1.2)


@pytest.mark.slow  # ~100 s: grows and decodes
@helpers.needs_pair('ende')
def test_grow_to_runs_the_table_with_the_grown_target_and_its_outputs_are_the_shipped_ones(
  monkeypatch,
):
  monkeypatch.setattr(timing, 'step_costs', _fake_step_costs)  # timing_test times them
  items = 'runlocal,grow_to=t5_1_1-small,num_examples=2,max_new_tokens=12,temperatures=0'
  config = ende.get_config(f'{items},drafters=distilled,verifiers=token')
  plan = evaluation.prepare(config)
  target, drafter = plan.pair.target, plan.drafters['distilled']
  assert (target.config.d_model, target.config.num_decoder_layers) == (512, 8)
  assert drafter.config.encoder_dim == 512  # followed the grown encoder
  assert 'target grown to t5_1_1-small: 512 wide, 8+8 layers' in plan.summary()
  decoded = []
  real = translation.translate_in_turn
  monkeypatch.setattr(
    translation, 'translate_in_turn', lambda *a, **k: decoded.append(real(*a, **k)) or decoded[-1]
  )
  rows = list(evaluation.rows(plan, progress=False))
  assert [r.method for r in rows] == ['autoregressive', 'token']
  # Greedy: the grown target's outputs, with or without the drafter, are the shipped target's.
  shipped = pretrained.load('ende').target
  want = translation.translate(
    shipped, None, plan.pair.tokenizer, plan.sources, method='autoregressive',
    sampling=SamplingConfig(temperature=0.0), batch_size=1, max_source_length=config.max_source_length,
    max_new_tokens=config.max_new_tokens,
  ).outputs  # fmt: skip
  for run in decoded[0].values():
    for got, expected in zip(run.outputs, want):
      np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
  'items, match',
  [
    ('grow_to=xxl', "config.grow_to='xxl' is not a T5 shape"),
    ('grow_to=t5-11b,target=/x,drafter=/y,tokenizer=/z,test_file=/w', 'not config.target'),
  ],
)
def test_bad_growth_fails_before_loading(items, match):
  with pytest.raises(ValueError, match=match):
    job_config.check_config(ende.get_config(items))


@helpers.needs_pair('ende')
def test_a_shape_the_target_cannot_reach_fails_before_growing():
  with pytest.raises(ValueError, match=r'd_kv differs \(64 -> 128\).*grows to: '):
    evaluation.prepare(ende.get_config('runlocal,grow_to=t5-11b'))


def test_the_grown_variants():
  large, xxl = ende.get_config('large'), debsumm.get_config('xxl')
  assert (large.grow_to, large.num_examples, large.gammas) == ('t5_1_1-large', 12, (3,))
  assert large.workdir == '/tmp/specdec_ende_large'
  assert (xxl.grow_to, xxl.param_dtype, xxl.drafter_sharding) == (
    't5_1_1-xxl',
    'bfloat16',
    'replicated',
  )
  assert xxl.workdir == '/tmp/specdec_debsumm_xxl' and xxl.pretrained == 'debsumm48m'
