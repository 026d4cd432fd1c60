"""A main-job config (experiments/configs/ende.py's fields), before anything is decoded: checked
(`check_config` without loading anything, `check_drafters` against the loaded models), its token
trees read (`named_trees`, `tree_rows`, `tree_spec`), and its pair loaded in the decoder layout it
asks for (`load_pair`, `decoder_layout`). `evaluation.prepare` calls these; so can a notebook."""

import dataclasses
import itertools
import numbers
from collections.abc import Sequence

import jax

from specdec_jax import decode, drafting, pretrained, sharding, step_models, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import translation
from specdec_jax.models import t5


def is_block(steps) -> bool:
  """Whether a drafter's step model drafts a block in one call (`block_size`)."""
  return step_models.capabilities(steps).drafting == 'block'


def tree_spec(steps, nodes: int) -> tuple[int, decode.TreeSpec]:
  """(depth, tree) of a token-tree row of `nodes` node slots for a drafter's step model: a block
  drafter's best-first tree on its one call's laws, depth min(nodes - 1, block_size); an
  autoregressive drafter's top-2 tree, depth (nodes - 1) / 2 (nodes odd). docs/method.md
  section 13 has both; docs/results.md section 11 what they keep per call."""
  if is_block(steps):
    return min(nodes - 1, step_models.capabilities(steps).block_size), decode.TreeSpec(nodes)
  if nodes % 2 == 0:
    raise ValueError(
      f"config.tree_nodes: an autoregressive drafter's top-2 tree has 1 + 2 * depth nodes, an "
      f'odd number; got {nodes}.'
    )
  return (nodes - 1) // 2, decode.TreeSpec(nodes, builder='topk', top_k=2)


def named_trees(config) -> list[tuple[str, int]]:
  """`config.trees` as (drafter name, nodes): each entry 'NAME:N', the drafter NAME's token tree
  of N node slots (`tree_spec`).

  Raises:
    ValueError for an entry of another form, or N < 2.
  """
  found = []
  for entry in config.get('trees') or ():
    name, _, nodes = str(entry).rpartition(':')
    if not name or not nodes.isdigit() or int(nodes) < 2:
      raise ValueError(
        f"config.trees holds 'DRAFTER:N' entries (N >= 2 node slots), got {entry!r}."
      )
    found.append((name, int(nodes)))
  return found


def tree_rows(config, chain: Sequence[str], drafters) -> list[tuple[str, int]]:
  """(drafter name, nodes) of the token-tree rows, each once: every drafter of `chain` with each
  N of `config.tree_nodes`, then each named tree of `config.trees` whose drafter is in
  `drafters` (the others: a drafter the pair does not ship, skipped as block drafters are)."""
  every = [(name, nodes) for name in chain for nodes in config.get('tree_nodes') or ()]
  named = [(name, nodes) for name, nodes in named_trees(config) if name in drafters]
  return list(dict.fromkeys(every + named))


def check_drafters(config, target, drafters: dict, tree_only: Sequence[str] = ()) -> None:
  """Raises ValueError naming the first (drafter, verifier, gamma) of the rows the loop would
  refuse, before any row runs: a verifier's constraints on drafters (`Verifier.check_drafter`),
  a drafter for another target (`step_models.check_state_reader`) and a block drafter's
  block_size (`step_models.check_block_drafter`), and each token tree of `tree_rows`
  (`tree_spec`; the loop's own checks of a tree, at each temperature). The drafters of
  `tree_only` have tree rows alone: no verifier or gamma of theirs is checked."""
  target_steps, _ = step_models.as_step_model(target)
  chain = [name for name in drafters if name not in tree_only]
  trees = tree_rows(config, chain, drafters)
  for name, drafter in drafters.items():
    steps, _ = step_models.as_step_model(drafter)
    try:
      step_models.check_state_reader(steps, target_steps)
      for verifier in config.verifiers if name in chain else ():
        verifiers.get(verifier).check_drafter(steps)
      gammas = (config.get('block_gammas') or config.gammas) if is_block(steps) else config.gammas
      for gamma in gammas if name in chain else ():
        step_models.check_block_drafter(steps, gamma)
      for nodes in [n for d, n in trees if d == name]:
        depth, tree = tree_spec(steps, nodes)
        for temperature in config.temperatures:
          spec = decode.LoopSpec(
            sampling=sampling_lib.SamplingConfig(temperature=temperature),
            max_new_tokens=config.max_new_tokens,
            gamma=depth,
            num_drafts=num_drafts(config),
            draft_stop=config.get('draft_stop'),
            proposal=config.get('proposal') or 'sample',
            tree=tree,
          )
          drafting.of(spec, step_models.capabilities(steps), step_models.capabilities(target_steps))
    except ValueError as e:
      raise ValueError(f'Drafter {name!r}: {e}') from e


def check_config(config) -> None:
  """Raises ValueError naming the first bad setting of a main-job config (`prepare`'s fields)
  that can be told without loading anything. Each loop setting is checked by the loop's own
  `decode.LoopSpec`, for every (temperature, gamma, verifier) the rows will run."""
  for name in ('num_examples', 'batch_size', 'max_source_length', 'max_new_tokens'):
    _positive_int(name, config[name])
  _positive_int('num_drafts', num_drafts(config))
  for name in ('temperatures', 'gammas', 'verifiers'):
    if not config[name]:
      raise ValueError(f'config.{name} is empty.')
  all_gammas = (*config.gammas, *(config.get('block_gammas') or ()))
  for name, least in (('gammas', 1), ('block_gammas', 1), ('tree_nodes', 2)):
    for g in config.get(name) or ():
      if isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < least:
        raise ValueError(f'config.{name} must hold ints >= {least}, got {tuple(config[name])}.')
  translation.check_methods(config.verifiers, 'config.verifiers')
  named_trees(config)  # raises on a malformed entry
  for temperature, gamma, verifier in itertools.product(
    config.temperatures, sorted(set(all_gammas)), config.verifiers
  ):
    decode.LoopSpec(  # raises on a bad temperature, draft_stop, or draft_stop beside K > 1
      sampling=sampling_lib.SamplingConfig(temperature=temperature),
      max_new_tokens=config.max_new_tokens,
      gamma=gamma,
      verifier=verifier,
      num_drafts=num_drafts(config),
      draft_stop=config.get('draft_stop'),
    )
  sharding.check_placement(config.get('drafter_sharding', 'auto'), 'config.drafter_sharding')
  if config.get('grow_to'):
    if config.get('target'):
      raise ValueError(
        'config.grow_to grows a pair of pretrained/ (config.pretrained), not config.target.'
      )
    if config.grow_to not in t5.CONFIGS:
      raise ValueError(
        f'config.grow_to={config.grow_to!r} is not a T5 shape; known: {", ".join(t5.CONFIGS)}.'
      )
  given = [k for k in ('drafter', 'tokenizer', 'test_file') if config.get(k)]
  if config.get('target') and len(given) < 3:
    missing = [k for k in ('drafter', 'tokenizer', 'test_file') if k not in given]
    raise ValueError(f'config.target is set: also set config.{", config.".join(missing)}.')
  if given and not config.get('target'):
    raise ValueError(f'config.{given[0]} needs config.target (a pair given by checkpoints).')


def _positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f'config.{name} must be an int >= 1, got {value!r}.')


def num_drafts(config) -> int:
  """K, the draft paths per iteration of every speculative row: `config.num_drafts` (default 1)."""
  return config.get('num_drafts', 1)


# The config fields `load_pair` reads (with `decoder_layout`'s answer and the mesh, what a loaded
# pair depends on).
PAIR_FIELDS = (
  'pretrained', 'target', 'drafter', 'tokenizer', 'test_file', 'source_prefix', 'grow_to',
  'param_dtype', 'drafter_sharding', 'decoder_layout',
)  # fmt: skip


def load_pair(config, mesh) -> pretrained.Pair:
  """The pair of a checked `config` placed on `mesh` as it loads (the target sharded, drafters
  per `config.drafter_sharding`): checkpoints of any format (`config.target`, `drafter`,
  `tokenizer`, `test_file`: `pretrained.from_checkpoints`), else the pair directory
  `config.pretrained` (`pretrained.load`), its target grown to the T5 shape `config.grow_to`
  where set (`pretrained.grow_pair`, params in `config.param_dtype`); its T5s in the decoder
  layout `decoder_layout(config, mesh)` names."""
  how, prefix = config.get('drafter_sharding', 'auto'), config.get('source_prefix', '')
  if not config.get('target'):
    pair = pretrained.load(config.pretrained, mesh=mesh, drafter_sharding=how)
    pair = dataclasses.replace(pair, source_prefix=prefix)
    if config.get('grow_to'):  # the target at another T5's cost, computing what it computed
      pair = pretrained.grow_pair(
        pair, config.grow_to, mesh=mesh, param_dtype=config.get('param_dtype') or None
      )
  else:
    pair = pretrained.from_checkpoints(
      config.target,
      {'drafter': config.drafter},
      tokenizer=config.tokenizer,
      test_file=config.test_file,
      source_prefix=prefix,
      mesh=mesh,
      drafter_sharding=how,
      param_dtype=config.get('param_dtype') or None,
    )
  return pretrained.fuse_pair(pair) if decoder_layout(config, mesh) == 'fused' else pair


DECODER_LAYOUTS = ('auto', 'fused', 't5x')


def decoder_layout(config, mesh) -> str:
  """The decoder layout a run's T5s decode in, 'fused' (models/t5_fused.py) or 't5x':
  `config.decoder_layout` ('auto' where unset). Both compute the same function; 'auto' takes the
  one whose autoregressive step is the faster where it was measured (docs/performance.md, "Fused
  decoder projections"), so every speedup is against the faster baseline: fused on a CPU (a step
  0.84 of T5X's), a GPU and a TPU mesh (XLA:TPU's estimate 0.97-0.99), T5X on one TPU chip
  (estimate 1.003)."""
  how = config.get('decoder_layout', 'auto')
  if how not in DECODER_LAYOUTS:
    raise ValueError(f'decoder_layout must be one of {DECODER_LAYOUTS}, got {how!r}.')
  return fastest_layout(mesh) if how == 'auto' else how


def fastest_layout(mesh) -> str:
  """'auto''s decoder layout on this backend and `mesh` (None: one device): 't5x' on one TPU
  chip, 'fused' elsewhere (`decoder_layout`)."""
  one_chip = mesh is None or mesh.size == 1
  return 't5x' if one_chip and jax.default_backend() == 'tpu' else 'fused'
