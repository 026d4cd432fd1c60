"""The main job on a pair given by checkpoints (T5X target, HF drafter), and the mesh settings."""

import pathlib

import pytest
from jax.sharding import AbstractMesh

from experiments.configs import ende
from specdec_jax import checkpoints, pretrained, sharding
from specdec_jax.measure import evaluation, timing

_REPO = pathlib.Path(__file__).resolve().parents[1]
_T5X = _REPO / 'tests' / 'testdata' / 't5x_tiny' / 'checkpoint_0'
_SPM = _REPO / 'pretrained' / 'ende' / 'spm.model'


def _config(tmp_path, **items):
  drafter = tmp_path / 'hf_drafter'
  if not drafter.exists():  # an HF export of the T5X model: both formats in one pair
    checkpoints.save_hf_t5(checkpoints.load_t5x(_T5X), drafter)
  test_file = tmp_path / 'test.jsonl'
  test_file.write_text(
    '{"source": "Click OK.", "target": "Klicken Sie auf OK."}\n'
    '{"source": "Open the file.", "target": "Datei öffnen."}\n'
  )
  settings = dict(
    target=str(_T5X),
    drafter=str(drafter),
    tokenizer=str(_SPM),
    test_file=str(test_file),
    source_prefix='translate English to German: ',
    num_examples=2,
    temperatures=(0.0,),
    gammas=(2,),
    max_new_tokens=4,
    max_source_length=16,
    timing_rounds=1,
  )
  settings.update(items)
  config = ende.get_config('runlocal')
  for key, value in settings.items():
    config[key] = value
  return config


def test_checkpoint_pair_runs_the_main_job(tmp_path, monkeypatch):
  # The timed model costs are faked (the loops' timers are timing_test's; ~8 CPU-s here).
  monkeypatch.setattr(
    timing, 'step_costs', lambda *a, **k: dict(c=0.1, c_fixed=0.05, c_alone=0.1, pass_cost=1.5)
  )
  plan = evaluation.prepare(_config(tmp_path))
  assert plan.mesh is None  # 'auto' on CPU: one device, no sharding
  assert list(plan.drafters) == ['drafter']  # the pair's one drafter, whatever config.drafters
  assert plan.pair.target.config.vocab_size == 32128
  assert plan.sources == [
    'translate English to German: Click OK.',
    'translate English to German: Open the file.',
  ]
  rows = list(evaluation.rows(plan, progress=False))
  assert [(r.drafter, r.method) for r in rows] == [
    ('-', 'autoregressive'),
    ('drafter', 'token'),
    ('drafter', 'block'),
  ]
  # The drafter is the target (same weights): at temperature 0 it drafts the target's argmax,
  # so every draft is accepted.
  assert rows[1].alpha == pytest.approx(1.0)
  assert rows[1].pass_cost == pytest.approx(1.5)  # the (faked) costs reached the row


@pytest.mark.parametrize(
  'items,error,match',
  [
    (dict(tokenizer=''), ValueError, 'also set config.tokenizer'),
    (dict(target='', drafter='x'), ValueError, 'config.drafter needs config.target'),
    (dict(test_file='/nonexistent/test.tsv'), FileNotFoundError, 'No test file'),
    (dict(mesh='2by4'), ValueError, 'DATAxMODEL'),
    (dict(mesh='1x64'), ValueError, 'needs 64 devices'),
    (dict(drafter_sharding='diagonal'), ValueError, "'model', 'replicated' or 'auto'"),
  ],
)
def test_bad_pair_or_mesh_settings_fail_before_decoding(tmp_path, items, error, match):
  with pytest.raises(error, match=match):
    evaluation.prepare(_config(tmp_path, **items))


def test_a_batch_must_split_over_data():
  mesh = AbstractMesh((2, 4), ('data', 'model'))
  sharding.check_batch(4, mesh)
  with pytest.raises(ValueError, match='Batch size 3 does not divide .* size 2'):
    sharding.check_batch(3, mesh)
  sharding.check_batch(3, AbstractMesh((1, 8), ('data', 'model')))  # rows whole on 'model'


@pytest.mark.parametrize(
  'path,kind',
  [
    ('gs://bucket/t5_11B/checkpoint_1000000', 't5x'),
    ('x/bigram.npz', 'ngram'),
    (str(_T5X), 't5x'),
    (str(_REPO / 'pretrained' / 'ende' / 'target'), 'ours'),
  ],
)
def test_checkpoint_format(path, kind):
  assert pretrained.checkpoint_format(path) == kind


def test_checkpoint_format_knows_hf(tmp_path):
  checkpoints.save_hf_t5(checkpoints.load_t5x(_T5X), tmp_path / 'hf')
  assert pretrained.checkpoint_format(tmp_path / 'hf') == 'hf'


def test_paper_variant_names_the_public_checkpoints():
  c = ende.get_config('paper')
  assert c.target.startswith('gs://') and c.target.endswith('t5_11B/checkpoint_1000000')
  assert c.drafter.endswith('t5_small/checkpoint_1000000')
  assert c.source_prefix == 'translate English to German: '
  assert (c.mesh, c.drafter_sharding, c.batch_size) == ('1x4', 'replicated', 1)
