"""Measured speculative decoding on a translation set: the rows of Leviathan et al.'s Table 2.

For each drafter, temperature and gamma: translate the same sources autoregressively and
speculatively (token and block verification), time both with compilation excluded, and report
alpha (measured, mean beta over verified positions), block efficiency, c (drafter step / target
step, measured), the walltime speedup, the speedup the paper's formula predicts from the measured
alpha, c and (gamma+1)-position pass cost, and BLEU. No flags here: experiments/translate.py and
notebooks call `run`.

Axis legend: B batch, S source length, M max_new_tokens.
"""

import csv
import dataclasses
import json
import os
import time
from collections.abc import Sequence

import jax
import numpy as np
import sacrebleu

from specdec_jax import analysis, checkpoints, decode, drafters, sampling as sampling_lib, timing
from specdec_jax.data import pairs as pairs_lib, tokenizer as tokenizer_lib


@dataclasses.dataclass
class Run:
  """One decoding method over the whole test set."""

  hypotheses: list[str]
  seconds: float  # decoding wall time, compilation excluded
  tokens: int  # tokens emitted
  stats: decode.DecodeStats  # pooled over all rows (`DecodeStats.summed`)


def translate(target, drafter, tokenizer: tokenizer_lib.Tokenizer, sources: Sequence[str], *,
              method: str, gamma: int, sampling: sampling_lib.SamplingConfig, batch_size: int,
              max_source_length: int, max_new_tokens: int, seed: int = 0) -> Run:
  """Translates `sources` with `method` ('autoregressive' or a verifier name), timing decoding.

  Every batch is padded to [batch_size, max_source_length], so each method compiles once; a
  warm-up call on the first batch is made before timing.
  """
  chunks = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]

  def run_batch(texts, rng):
    texts = list(texts) + [''] * (batch_size - len(texts))
    ids, mask = tokenizer.encode_batch(texts, max_source_length, truncate=True)
    kw = dict(sampling=sampling, max_new_tokens=max_new_tokens, rng=rng)
    if method == 'autoregressive':
      return decode.generate(target, ids, mask, **kw)
    return decode.speculative_generate(target, drafter, ids, mask, gamma=gamma, verifier=method,
                                       **kw)

  jax.block_until_ready(run_batch(chunks[0], jax.random.key(seed)))
  hyps, seconds, outputs = [], 0.0, []
  for i, chunk in enumerate(chunks):
    start = time.perf_counter()
    out = jax.block_until_ready(run_batch(chunk, jax.random.key(seed + 1 + i)))
    seconds += time.perf_counter() - start
    n = len(chunk)
    hyps += [tokenizer.decode(row) for row in np.asarray(out.tokens[:n])]
    outputs.append(jax.tree.map(lambda x: np.asarray(x)[:n], (out.lengths, out.stats)))
  lengths = np.concatenate([o[0] for o in outputs])
  stats = jax.tree.map(lambda *x: np.concatenate(x), *[o[1] for o in outputs])
  return Run(hyps, seconds, int(lengths.sum()), stats.summed())


def load_drafter(path: str):
  """A T5 drafter (orbax directory) or an n-gram drafter (.npz)."""
  if path.endswith('.npz'):
    return drafters.NGramDrafter.load(path)
  return checkpoints.restore(path)


def run(config) -> list[dict]:
  """Runs every (drafter, temperature, gamma, verifier) of `config`; returns the table rows.

  `config` fields: target, drafters (name -> path), tokenizer, test_pairs, num_examples,
  batch_size, max_source_length, max_new_tokens, temperatures, gammas, verifiers, seed.
  """
  target = checkpoints.restore(config.target)
  tokenizer = tokenizer_lib.Tokenizer.load(config.tokenizer)
  if tokenizer.vocab_size > target.config.vocab_size:
    raise ValueError(f'Tokenizer has {tokenizer.vocab_size} pieces but the target only '
                     f'{target.config.vocab_size} logits.')
  test = pairs_lib.load_pairs(config.test_pairs)[: config.num_examples]
  sources, references = [s for s, _ in test], [t for _, t in test]
  common = dict(batch_size=config.batch_size, max_source_length=config.max_source_length,
                max_new_tokens=config.max_new_tokens, seed=config.seed)

  def bleu(hyps):
    return sacrebleu.corpus_bleu(hyps, [references]).score

  rows = []
  baselines = {}
  for temperature in config.temperatures:
    sampling = sampling_lib.SamplingConfig(temperature=temperature)
    base = translate(target, None, tokenizer, sources, method='autoregressive', gamma=1,
                     sampling=sampling, **common)
    baselines[temperature] = base
    rows.append(dict(task='EnDe', drafter='-', method='autoregressive', temp=temperature,
                     gamma=0, alpha=float('nan'), block_efficiency=1.0, c=float('nan'),
                     speedup=1.0, predicted_speedup=float('nan'), bleu=bleu(base.hypotheses),
                     seconds=base.seconds, tokens_per_s=base.tokens / base.seconds))
  for drafter_name, drafter_path in config.drafters.items():
    drafter = load_drafter(drafter_path)
    for gamma in config.gammas:
      costs = timing.step_costs(target, drafter, batch_size=config.batch_size,
                         source_length=config.max_source_length, gamma=gamma)
      for temperature in config.temperatures:
        sampling = sampling_lib.SamplingConfig(temperature=temperature)
        for verifier in config.verifiers:
          r = translate(target, drafter, tokenizer, sources, method=verifier, gamma=gamma,
                        sampling=sampling, **common)
          alpha = float(r.stats.alpha)
          predicted = analysis.walltime_improvement_measured(alpha, gamma, costs['c'],
                                                             costs['pass_cost'])
          rows.append(dict(
            task='EnDe', drafter=drafter_name, method=verifier, temp=temperature, gamma=gamma,
            alpha=alpha, block_efficiency=float(r.stats.block_efficiency),
            c=costs['c'], speedup=baselines[temperature].seconds / r.seconds,
            predicted_speedup=float(predicted), bleu=bleu(r.hypotheses), seconds=r.seconds,
            tokens_per_s=r.tokens / r.seconds))
  return rows


_COLUMNS = ('task', 'drafter', 'method', 'temp', 'gamma', 'alpha', 'block_efficiency', 'c',
            'speedup', 'predicted_speedup', 'bleu', 'tokens_per_s')


def format_table(rows: list[dict]) -> str:
  """A plain-text table in the form of Leviathan et al. Table 2 (+ block efficiency, c, BLEU)."""
  header = ' '.join(f'{c:>17s}' if i > 2 else f'{c:<14s}' for i, c in enumerate(_COLUMNS))
  lines = [header]
  for row in rows:
    cells = []
    for i, col in enumerate(_COLUMNS):
      v = row[col]
      if isinstance(v, float):
        text = '-' if np.isnan(v) else (f'{v:.3f}' if col in ('alpha', 'c') else f'{v:.2f}')
        if col == 'speedup' and not np.isnan(v):
          text += 'x'
      else:
        text = str(v)
      cells.append(f'{text:>17s}' if i > 2 else f'{text:<14s}')
    lines.append(' '.join(cells))
  return '\n'.join(lines)


def write_results(rows: list[dict], workdir: str) -> dict[str, str]:
  """Writes results.csv, results.json and speedup.png into workdir; returns their paths."""
  os.makedirs(workdir, exist_ok=True)
  paths = {k: os.path.join(workdir, f) for k, f in
           (('csv', 'results.csv'), ('json', 'results.json'), ('png', 'speedup.png'))}
  with open(paths['csv'], 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  with open(paths['json'], 'w') as f:
    json.dump(rows, f, indent=1, default=float)
  _plot(rows, paths['png'])
  return paths


def _plot(rows: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  temps = sorted({r['temp'] for r in rows})
  fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    spec = [r for r in rows if r['temp'] == temp and r['method'] != 'autoregressive']
    for drafter in sorted({r['drafter'] for r in spec}):
      for method, style in (('token', '-o'), ('block', '--s'), ('greedy_block', ':^')):
        pts = sorted((r['gamma'], r['speedup'], r['predicted_speedup']) for r in spec
                     if r['drafter'] == drafter and r['method'] == method)
        if pts:
          g, s, p = zip(*pts)
          line, = ax.plot(g, s, style, label=f'{drafter} / {method} (measured)')
          ax.plot(g, p, style[1:], color=line.get_color(), alpha=0.35,
                  label=f'{drafter} / {method} (predicted)')
    ax.axhline(1.0, color='gray', lw=0.8)
    ax.set(title=f'EnDe, temperature {temp}', xlabel='gamma', ylabel='walltime speedup vs AR')
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
