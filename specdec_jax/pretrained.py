"""The shipped model pairs, loaded in one call.

  pair = pretrained.load('ende')        # or load('/path/to/a/pair_dir') laid out the same way
  out = decode.speculative_generate(pair.target, pair.drafter, ids, mask,
                                    gamma=pair.gamma(temperature), ...)
  pair.drafters['bigram'], pair.tokenizer, pair.test_pairs()

A pair directory holds `target/` (a `checkpoints.save` directory), the drafters, `spm.model`,
`test.tsv` and `pair.json`, which names the drafters (directory -> T5 drafter, `.npz` -> n-gram
drafter), the recommended one, and the recommended gamma per temperature (chosen by measured
speedup; see the directory's MODEL_CARD.md).
"""

import dataclasses
import json
import pathlib
from typing import Any

from specdec_jax import checkpoints
from specdec_jax import drafters as drafters_lib
from specdec_jax.data import pairs as pairs_lib
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'pretrained'
_DEFAULT_MANIFEST = {
  'target': 'target',
  'drafters': {'small-t5': 'drafter', 'bigram': 'bigram.npz'},
  'recommended': 'small-t5',
  'gamma': {'0': 4, '1': 4},
}


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
  """

  directory: pathlib.Path
  target: t5.T5Model
  drafters: dict[str, Any]
  recommended: str
  tokenizer: tokenizer_lib.Tokenizer
  gammas: dict[float, int]

  @property
  def drafter(self):
    """The recommended drafter, ready for `decode.speculative_generate`."""
    return self.drafters[self.recommended]

  def gamma(self, temperature: float) -> int:
    """The recommended gamma at `temperature` (that of the nearest listed temperature)."""
    nearest = min(self.gammas, key=lambda t: abs(t - temperature))
    return self.gammas[nearest]

  def test_pairs(self) -> list[tuple[str, str]]:
    """The shipped held-out (source, reference) pairs."""
    return pairs_lib.load_pairs(str(self.directory / 'test.tsv'))


def load_drafter(path: str | pathlib.Path):
  """A T5 drafter (a `checkpoints.save` directory) or an n-gram drafter (`.npz`)."""
  path = pathlib.Path(path)
  if path.suffix == '.npz':
    return drafters_lib.NGramDrafter.load(str(path))
  return checkpoints.restore(path)


def load(name_or_path: str | pathlib.Path = 'ende') -> Pair:
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
  manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else _DEFAULT_MANIFEST
  if manifest['recommended'] not in manifest['drafters']:
    raise ValueError(
      f'{manifest_file}: recommended drafter {manifest["recommended"]!r} is not '
      f'among its drafters {sorted(manifest["drafters"])}.'
    )
  target = checkpoints.restore(directory / manifest['target'])
  found = {name: load_drafter(directory / rel) for name, rel in manifest['drafters'].items()}
  for name, drafter in found.items():
    if drafter.steps.vocab_size != target.config.vocab_size:
      raise ValueError(
        f'Drafter {name!r} has vocab_size {drafter.steps.vocab_size}, the target '
        f'{target.config.vocab_size}.'
      )
  return Pair(
    directory=directory,
    target=target,
    drafters=found,
    recommended=manifest['recommended'],
    tokenizer=tokenizer_lib.Tokenizer.load(str(directory / 'spm.model')),
    gammas={float(t): int(g) for t, g in manifest['gamma'].items()},
  )
