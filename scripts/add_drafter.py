"""Adds a drafter to a pair directory (e.g. pretrained/ende) and records it in its pair.json.

  python -m scripts.add_drafter --pair=pretrained/ende --name=distilled \
      --source=workdir/distill/best --recommend --gamma=0:4,1:3

--source is a `checkpoints.save` directory (a T5 drafter; --storage_dtype=bfloat16 halves it;
--share_with_target leaves out the arrays it holds equal to the pair's target's, e.g. the frozen
embeddings and output layer of `distill_drafter.py:block_wide`'s) or an n-gram `.npz`. `specdec_jax.pretrained.load` then lists it; --recommend makes it the pair's
`.drafter`, and --gamma sets the recommended gamma per temperature.
"""

import json
import pathlib
import shutil

import jax
from absl import app, flags

from specdec_jax import checkpoints, pretrained

_PAIR = flags.DEFINE_string('pair', 'pretrained/ende', 'Pair directory.')
_NAME = flags.DEFINE_string('name', None, 'Drafter name.', required=True)
_SOURCE = flags.DEFINE_string('source', None, 'Drafter checkpoint or .npz.', required=True)
_RECOMMEND = flags.DEFINE_bool('recommend', False, 'Make it the recommended drafter.')
_GAMMA = flags.DEFINE_string('gamma', '', 'Recommended gamma per temperature: T:G,T:G.')
_STORAGE = flags.DEFINE_enum(
  'storage_dtype', None, ['bfloat16'], "A T5 drafter's weights stored as (checkpoints.save)."
)
_SHARE = flags.DEFINE_bool(
  'share_with_target', False, "Store the arrays equal to the target's once (checkpoints.save)."
)


def main(argv):
  del argv
  pair_dir, source = pathlib.Path(_PAIR.value), pathlib.Path(_SOURCE.value)
  manifest_file = pair_dir / 'pair.json'
  manifest = pretrained.read_manifest(pair_dir)
  if source.suffix == '.npz':
    rel = f'{_NAME.value}.npz'
    if source.resolve() != (pair_dir / rel).resolve():  # a drafter fitted into the pair: as it is
      shutil.copy(source, pair_dir / rel)
  else:
    rel = _NAME.value
    model = checkpoints.restore(source)
    shutil.rmtree(pair_dir / rel, ignore_errors=True)
    shared = pair_dir / manifest['target'] if _SHARE.value else None
    checkpoints.save(
      jax.device_get(model), pair_dir / rel, storage_dtype=_STORAGE.value, shared_with=shared
    )
  manifest['drafters'][_NAME.value] = rel
  if _RECOMMEND.value:
    manifest['recommended'] = _NAME.value
  if _GAMMA.value:
    manifest['gamma'] = dict(item.split(':') for item in _GAMMA.value.split(','))
    manifest['gamma'] = {t: int(g) for t, g in manifest['gamma'].items()}
  manifest_file.write_text(json.dumps(manifest, indent=2) + '\n')
  pair = pretrained.load(pair_dir)  # checks the result loads
  print(
    f'{pair_dir}: drafters {sorted(pair.drafters)}, recommended {pair.recommended}, '
    f'gammas {pair.gammas}'
  )


if __name__ == '__main__':
  app.run(main)
