"""The shipped model pairs, loaded in one call.

  pair = pretrained.load('ende')        # or load('/path/to/a/pair_dir') laid out the same way
  out = decode.speculative_generate(pair.target, pair.drafter, ids, mask,
                                    gamma=pair.gamma(temperature), ...)
  pair.drafters['bigram'], pair.tokenizer, pair.test_pairs()

A pair directory holds `target/` (a `checkpoints.save` directory), the drafters, `spm.model`,
`test.tsv` and `pair.json`, which names the drafters (directory -> T5 drafter, `.npz` -> n-gram
drafter), the recommended one, and the recommended gamma per temperature (chosen by measured
speedup; see the directory's MODEL_CARD.md).

A pair can also be put together from checkpoints of any supported format (`from_checkpoints`:
e.g. a T5X T5-XXL target and an HF T5-small drafter, as in Leviathan et al.), and either kind can
be placed on a device mesh as it loads (`mesh=`: the target sharded by `sharding.DEFAULT_RULES`,
each drafter replicated or sharded per `drafter_sharding`).
"""

import copy
import dataclasses
import json
import pathlib
from typing import Any

import jax

from specdec_jax import checkpoints, sharding, step_models
from specdec_jax import drafters as drafters_lib
from specdec_jax.data import pairs as pairs_lib
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5, t5_fused

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'pretrained'
_DEFAULT_MANIFEST = {
  'target': 'target',
  'drafters': {'small-t5': 'drafter', 'bigram': 'bigram.npz'},
  'recommended': 'small-t5',
  'gamma': {'0': 4, '1': 4},
}


def read_manifest(directory: str | pathlib.Path) -> dict:
  """A pair directory's `pair.json` as a dict of its own (the caller may change it): the file, or
  the manifest of a directory without one (target 'target', drafters 'small-t5' and 'bigram')."""
  manifest_file = pathlib.Path(directory) / 'pair.json'
  if manifest_file.exists():
    return json.loads(manifest_file.read_text())
  return copy.deepcopy(_DEFAULT_MANIFEST)


@dataclasses.dataclass
class Pair:
  """A target, its drafters and tokenizer.

  Attributes:
    directory: where it was read from.
    target: the target `T5Model`.
    drafters: every shipped drafter by name (T5 drafters and n-gram drafters).
    recommended: the name of the recommended drafter.
    tokenizer: the SentencePiece tokenizer both models use.
    gammas: recommended gamma by temperature.
    test_file: the held-out pairs (TSV or JSONL); `directory / 'test.tsv'` when None.
    source_prefix: prepended to every source before tokenizing (e.g. T5's
      'translate English to German: '); '' for models trained without one.
  """

  directory: pathlib.Path
  target: t5.T5Model
  drafters: dict[str, Any]
  recommended: str
  tokenizer: tokenizer_lib.Tokenizer
  gammas: dict[float, int]
  test_file: pathlib.Path | None = None
  source_prefix: str = ''

  @property
  def drafter(self):
    """The recommended drafter, ready for `decode.speculative_generate`."""
    return self.drafters[self.recommended]

  def gamma(self, temperature: float) -> int:
    """The recommended gamma at `temperature` (that of the nearest listed temperature)."""
    nearest = min(self.gammas, key=lambda t: abs(t - temperature))
    return self.gammas[nearest]

  def test_pairs(self) -> list[tuple[str, str]]:
    """The held-out (source, reference) pairs, sources with `source_prefix` prepended."""
    test_file = self.test_file or self.directory / 'test.tsv'
    return [(self.source_prefix + s, t) for s, t in pairs_lib.load_pairs(str(test_file))]


def checkpoint_format(path: str | pathlib.Path) -> str:
  """'ngram' (`.npz`), 'ours' (a `checkpoints.save` directory), 'hf' (config.json with weights) or
  't5x' (anything else, including `gs://` and other tensorstore URLs)."""
  text = str(path)
  if text.endswith('.npz'):
    return 'ngram'
  if '://' in text:
    return 't5x'
  path = pathlib.Path(path)
  if (path / 'params').is_dir() and (path / 'config.json').is_file():
    return 'ours'
  if (path / 'config.json').is_file():
    return 'hf'
  return 't5x'


def load_model(
  path: str | pathlib.Path, *, mesh=None, how: str = 'model', param_dtype: str | None = None
):
  """A target or drafter from a checkpoint of any supported format (see `checkpoint_format`).

  Args:
    path: a `checkpoints.save` directory, an HF `save_pretrained` directory, a T5X checkpoint
      (directory, msgpack file, OCDBT, or a tensorstore URL such as `gs://...`), or an n-gram `.npz`.
    mesh: build the params directly on this mesh, each process reading only the slices its
      devices hold (the `checkpoints` loaders); None leaves them on the default device.
    how: with a mesh, 'model' (shard by `sharding.DEFAULT_RULES`), 'replicated' (whole on every
      device), or 'auto': replicated under `sharding.REPLICATE_BELOW` params, else sharded (a T5X
      checkpoint carries no config to count from before reading: 'auto' replicates it).
    param_dtype: the params' dtype on the device (e.g. 'bfloat16': half the memory of float32),
      separate from the dtype the model computes in; None keeps the loader's default.
  """
  kind = checkpoint_format(path)
  if kind == 'ngram':
    model = drafters_lib.NGramDrafter.load(str(path))
    if mesh is None:
      return model
    return dataclasses.replace(model, params=sharding.replicated(model.params, mesh))
  sharding.check_placement(how)
  rules = sharding.rules_for(how, _param_count(path, kind) if how == 'auto' else 0)
  load = {'ours': checkpoints.restore, 'hf': checkpoints.load_hf_t5, 't5x': checkpoints.load_t5x}
  model = load[kind](path, mesh=mesh, rules=rules, param_dtype=param_dtype)
  # Its activations follow its params: a replicated model's program has no collective.
  return model if mesh is None else model.replace(rules=rules)


def _param_count(path, kind: str) -> int:
  """The params of a T5 checkpoint, from its config alone (0 when it has none: T5X)."""
  if kind == 't5x':
    return 0
  config = json.loads((pathlib.Path(path) / 'config.json').read_text())
  config = checkpoints.config_from_hf(config) if kind == 'hf' else t5.T5Config(**config)
  shapes = jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))
  return sum(x.size for x in jax.tree.leaves(shapes))


def load_drafter(path: str | pathlib.Path, *, mesh=None, how: str = 'auto'):
  """A drafter checkpoint (`load_model`; a small one is replicated on a mesh by default)."""
  return load_model(path, mesh=mesh, how=how)


def check_pair(target, found: dict) -> None:
  """One ValueError, before any work, for a target that cannot be one (a block drafter's
  checkpoint) or a drafter that cannot draft for it (another vocabulary, or target states of
  another width)."""
  try:
    step_models.check_target(target.steps)
  except ValueError as e:
    raise ValueError(f'The target: {e}') from e
  for name, drafter in found.items():
    if drafter.steps.vocab_size != target.config.vocab_size:
      raise ValueError(
        f'Drafter {name!r} has vocab_size {drafter.steps.vocab_size}, the target '
        f'{target.config.vocab_size}.'
      )
    try:
      step_models.check_state_reader(drafter.steps, target.steps)
      step_models.check_encoder_reader(drafter.steps, target.steps)
    except ValueError as e:
      raise ValueError(f'Drafter {name!r}: {e}') from e


def from_checkpoints(
  target: str | pathlib.Path,
  drafters: dict[str, str | pathlib.Path],
  *,
  tokenizer: str | pathlib.Path,
  test_file: str | pathlib.Path,
  source_prefix: str = '',
  gamma: int = 5,
  mesh=None,
  drafter_sharding: str = 'auto',
  param_dtype: str | None = None,
) -> Pair:
  """A pair of any checkpoints: e.g. a T5X T5-XXL target with an HF T5-small drafter.

  Args:
    target: the target's checkpoint (see `load_model`).
    drafters: drafter name -> checkpoint; the first is the recommended one.
    tokenizer: the SentencePiece model both use.
    test_file: (source, reference) pairs, TSV or JSONL (`data.pairs.load_pairs`).
    source_prefix: prepended to each source (T5's task prefix).
    gamma: the recommended gamma at every temperature.
    mesh, drafter_sharding, param_dtype: where the params go and how they are stored
      (`load_model`); the target is sharded by the default rules.

  Raises:
    FileNotFoundError naming a missing tokenizer or test file; ValueError if a drafter's
    vocabulary differs from the target's.
  """
  for what, path in (('tokenizer', tokenizer), ('test file', test_file)):
    if not pathlib.Path(path).is_file():
      raise FileNotFoundError(f'No {what} at {path}.')
  if not drafters:
    raise ValueError('from_checkpoints needs at least one drafter.')
  model = load_model(target, mesh=mesh, how='model', param_dtype=param_dtype)
  found = {
    n: load_model(p, mesh=mesh, how=drafter_sharding, param_dtype=param_dtype)
    for n, p in drafters.items()
  }
  check_pair(model, found)
  return Pair(
    directory=pathlib.Path(str(target)),
    target=model,
    drafters=found,
    recommended=next(iter(drafters)),
    tokenizer=tokenizer_lib.Tokenizer.load(str(tokenizer)),
    gammas={0.0: gamma, 1.0: gamma},
    test_file=pathlib.Path(test_file),
    source_prefix=source_prefix,
  )


def load(
  name_or_path: str | pathlib.Path = 'ende', *, mesh=None, drafter_sharding: str = 'auto'
) -> Pair:
  """Loads a shipped pair by name (a directory of `pretrained/`) or any pair directory.

  Raises:
    FileNotFoundError: no such pair, naming the pairs that exist.
    ValueError: `pair.json` names a recommended drafter it does not list, or the drafters'
      vocabularies differ from the target's.
  """
  directory = pathlib.Path(name_or_path)
  if not directory.is_dir():
    directory = ROOT / str(name_or_path)
  if not directory.is_dir():
    known = sorted(p.name for p in ROOT.iterdir() if p.is_dir()) if ROOT.is_dir() else []
    raise FileNotFoundError(
      f'No pretrained pair {name_or_path!r}: not a directory, and not one of {known} in {ROOT}.'
    )
  manifest_file = directory / 'pair.json'
  manifest = read_manifest(directory)
  if manifest['recommended'] not in manifest['drafters']:
    raise ValueError(
      f'{manifest_file}: recommended drafter {manifest["recommended"]!r} is not '
      f'among its drafters {sorted(manifest["drafters"])}.'
    )
  # Paths relative to the directory; absolute ones and URLs (gs://...) as they are.
  where = lambda rel: rel if '://' in rel else directory / rel
  target = load_model(where(manifest['target']), mesh=mesh, how='model')
  found = {
    name: load_drafter(where(rel), mesh=mesh, how=drafter_sharding)
    for name, rel in manifest['drafters'].items()
  }
  check_pair(target, found)
  return Pair(
    directory=directory,
    target=target,
    drafters=found,
    recommended=manifest['recommended'],
    tokenizer=tokenizer_lib.Tokenizer.load(str(directory / 'spm.model')),
    gammas={float(t): int(g) for t, g in manifest['gamma'].items()},
  )


def grow_pair(
  pair: Pair, shape: str, *, mesh=None, param_dtype: str | None = None, seed: int = 0
) -> Pair:
  """`pair` with its target grown to the T5 shape `shape` (a name of `t5.CONFIGS`, e.g.
  't5_1_1-xxl': `t5_growth.grown_config`), built on `mesh` sharded by the default rules in
  `param_dtype` (`t5_growth.grow_placed`: never whole in host memory). It computes what the
  shipped target computed, at the cost of a target of that shape; each T5 drafter over the
  target's encoder follows it (`t5_growth.follow_grown_encoder`, and `follow_grown_states` for
  one reading its states: a block drafter; placed as it was), the n-gram
  drafters, tokenizer and test set are the pair's own.

  Raises:
    ValueError: a shape the target cannot grow to exactly, naming those it can.
  """
  from specdec_jax.models import t5_growth  # only a grown pair needs it

  config = t5_growth.grown_config(pair.target.config, shape)
  grow_key, follow_key = jax.random.split(jax.random.key(seed))
  target = t5_growth.grow_placed(pair.target, config, grow_key, mesh=mesh, param_dtype=param_dtype)
  drafters = {}
  for name, drafter in pair.drafters.items():
    if isinstance(drafter, t5.T5Model) and drafter.steps.shares_target_encoder:
      moved = t5_growth.follow_grown_encoder(drafter, config.d_model, follow_key)
      if moved.config.feature_dim:  # it reads the target's states too (EAGLE-style, block)
        moved = t5_growth.follow_grown_states(
          moved, config.d_model, jax.random.fold_in(follow_key, 1)
        )
      if mesh is not None:
        place = sharding.param_shardings(moved.params, mesh, drafter.rules)
        moved = moved.replace(params=jax.device_put(moved.params, place))
      drafter = moved
    drafters[name] = drafter
  check_pair(target, drafters)
  return dataclasses.replace(pair, target=target, drafters=drafters)


def fuse_pair(pair: Pair) -> Pair:
  """`pair` with every T5 model's decoder projections in the fused layout
  (`t5_fused.fuse_projections`, on the mesh the pair lies on; docs/performance.md "Fused decoder
  projections")."""
  fuse = lambda m: t5_fused.fuse_projections(m) if isinstance(m, t5.T5Model) else m
  drafters = {name: fuse(d) for name, d in pair.drafters.items()}
  return dataclasses.replace(pair, target=fuse(pair.target), drafters=drafters)
