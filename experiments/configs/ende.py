r"""The main job: EN->DE on the shipped pair (pretrained/ende), Table 2 of Leviathan et al.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal  # ~2 min smoke
  python -m experiments.translate --config=experiments/configs/ende.py:gammas=3-5-7,batch_size=8
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=/my/pair_dir

Batch 1 as in the paper. Numbers it gave on a 2-core CPU are in pretrained/ende/MODEL_CARD.md;
on CPU the (gamma+1)-position target pass is not free (see the c and predicted columns).
"""

import pathlib

import ml_collections

_PRETRAINED = pathlib.Path(__file__).resolve().parents[2] / 'pretrained' / 'ende'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`arg`: comma-separated `runlocal` and/or key=value overrides (lists joined with '-');
  `pretrained=DIR` reads the pair from DIR (laid out as scripts/ship_pretrained.py writes it)."""
  options = [o for o in (arg or '').split(',') if o]
  pretrained = pathlib.Path(_PRETRAINED)
  for option in options:
    if option.startswith('pretrained='):
      pretrained = pathlib.Path(option.split('=', 1)[1])
  options = [o for o in options if not o.startswith('pretrained=')]
  c = ml_collections.ConfigDict()
  c.target = str(pretrained / 'target')
  c.drafters = {'small-t5': str(pretrained / 'drafter'), 'bigram': str(pretrained / 'bigram.npz')}
  c.tokenizer = str(pretrained / 'spm.model')
  c.test_pairs = str(pretrained / 'test.tsv')
  c.workdir = '/tmp/specdec_ende'
  c.num_examples = 500
  c.batch_size = 1
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.temperatures = (0.0, 1.0)
  c.gammas = (3, 5, 7)
  c.verifiers = ('token', 'block')
  c.seed = 0
  for option in options:
    if option == 'runlocal':
      c.num_examples, c.gammas, c.max_new_tokens = 16, (4,), 32
      c.workdir = '/tmp/specdec_ende_runlocal'
    elif '=' in option:
      key, value = option.split('=', 1)
      if key not in c:
        raise ValueError(f'Unknown config key {key!r} in {arg!r}.')
      current = c[key]
      if isinstance(current, tuple):
        c[key] = tuple(type(current[0])(v) for v in value.split('-'))
      else:
        c[key] = type(current)(value)
    else:
      raise ValueError(f'Unknown config option {option!r}; use runlocal or key=value.')
  return c
