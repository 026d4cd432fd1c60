r"""Token vs block verification on the shipped EN->DE pair: Sun et al. 2024 (arXiv 2403.10444).

  python -m experiments.verification --config=experiments/configs/verification.py           # ~25 min
  python -m experiments.verification --config=experiments/configs/verification.py:runlocal  # < 1 min
  python -m experiments.verification --config=experiments/configs/verification.py:batch     # ~6 min
  python -m experiments.verification --config=experiments/configs/verification.py:multipath
  python -m experiments.verification --config=experiments/configs/verification.py:seeds=0,1,2,3,4

Parts (`parts`, run in this order):
  toy    Sun et al.'s two-token toy model (§3: Mb = (1/3, 2/3), Ms = (2/3, 1/3) over {A, B},
         context-free): P(accepted length >= k) of each verifier, exact by enumeration (rational
         arithmetic) for 'token' and 'block', the first iteration's law from its kernel's
         distribution mode for 'greedy_block' (float32), Monte Carlo with the jitted verifier for
         any other verifier in `verifiers`; at every gamma of `toy_gammas` (the paper's: 2).
  sweep  Tables 1-2 / Figures 4-5: every drafter x gamma x temperature x batch size x seed x
         verifier, plus autoregressive decoding per temperature x batch size x seed (the speedup
         baseline): block efficiency (tokens per target call), tokens/s, walltime speedup; then
         mean and standard deviation over seeds and the relative gain of each verifier over 'token'.
  ccdf   Figure 3(b): P(accepted length >= k) on the real pair, from the per-iteration trace of
         `speculative_generate(..., trace=True)` (iterations in which a row was still emitting),
         per drafter x verifier at `ccdf_gammas` x `ccdf_temperatures`, first seed; untimed.

Default: drafters 'distilled' (alpha ~0.45) and 'small-t5' (alpha ~0.3), gamma 4/6/8, temperature
0.2/0.6/1.0, seeds 0/1/2, batch 1, the first 80 test sentences. Budget, measured on the 2-core
CPU with a training job beside it (16 sentences x both drafters x gamma 4, 8 x temperature 0.2,
1.0, one seed: 3.6 min): ~9.5 s to compile each of the 43 programs (36 drafter x gamma x
temperature x verifier, 3 autoregressive, 4 traced), ~0.11 s a sentence speculative (0.08-0.15 s,
16 target tokens on average) and ~0.05 s autoregressive. 108 speculative, 9 autoregressive and 4
traced runs of 80 sentences: 43 x 9.5 s + 112 x 80 x 0.11 s + 9 x 80 x 0.05 s ~ 24 min. On an idle
machine it is faster; `num_examples=N` scales everything but the compilations (~7 min).

`batch` (Sun et al. App. D.1): the 'distilled' drafter at gamma 4, temperature 0 and 1, batch
1 / 8 / 32, one seed, 64 sentences (sorted by source length, so a batch's rows are of similar
lengths): block efficiency and tokens/s of autoregressive, token and block decoding; batch.png.
18 programs to compile (~3 min) and ~3 min of decoding (estimated from the rates above, not run).

`multipath` (issue 25): the sweep on the 48M pair (`ende48m`): the 'distilled' drafter (add
`drafters=distilled,trigram` for the trigram), gamma 3 / 5, temperature 0 / 1, one seed, 12
sentences (50 programs to compile: ~20 min on 2 cores); each verifier alone, with K = 2
and 4 draft paths (`speculative_generate(..., num_drafts=K)`: 'block/K2' is greedy multi-path
block verification, 'token/K2' recursive rejection) and with draft stops 0.3 / 0.5 / 0.7
(adaptive draft length, 'block/stop0.5'). `num_drafts=...` / `draft_stops=...` add the same
variants to any sweep.

`greedy`: every part with greedy block verification beside token and block verification
('greedy_block'; Sun et al. App. C): the toy's first-iteration CCDF from its kernel's law, the
sweep and the traced CCDF. The check of its Appendix C (greedy block verification) on both 48M pairs is
experiments/configs/greedy_block.py.

`runlocal`: one drafter, gamma 2, temperature 1, two seeds, 4 sentences of at most 16 new tokens;
every part runs and every file is written (~45 s); `batch,runlocal`: batch 1 and 2, one seed.
Items apply in the order written (experiments/configs/common.py): `runlocal,num_examples=8` keeps
8 sentences. Sources are sorted by length (`sort_by_length`) in every variant.
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.drafters, c.gammas, c.temperatures, c.seeds = ('distilled',), (2,), (1.0,), (0, 1)
  c.num_examples, c.max_new_tokens = 4, 16
  if len(c.batch_sizes) > 1:  # after `batch`: still a batch sweep, on small batches
    c.batch_sizes, c.seeds = (1, 2), (0,)
  c.ccdf_gammas, c.ccdf_temperatures, c.toy_gammas = (2,), (1.0,), (2, 4)
  c.workdir = '/tmp/specdec_verification_runlocal'


def _batch(c):
  c.parts = ('sweep',)
  c.drafters, c.gammas, c.temperatures, c.seeds = ('distilled',), (4,), (0.0, 1.0), (0,)
  c.batch_sizes, c.num_examples = (1, 8, 32), 64
  c.workdir = '/tmp/specdec_verification_batch'


def _multipath(c):
  c.parts = ('sweep',)
  c.pretrained = 'ende48m'
  c.drafters, c.gammas, c.temperatures, c.seeds = ('distilled',), (3, 5), (0.0, 1.0), (0,)
  c.num_drafts, c.draft_stops = (1, 2, 4), (0.3, 0.5, 0.7)
  c.num_examples = 12
  c.workdir = '/tmp/specdec_verification_multipath'


def _greedy(c):
  c.verifiers = ('token', 'block', 'greedy_block')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.parts = ('toy', 'sweep', 'ccdf')  # any of these, run in this order
  c.pretrained = 'ende'  # a pair under pretrained/, or a directory laid out the same way
  c.drafters = ('distilled', 'small-t5')  # names of the pair's drafters, or all
  c.verifiers = ('token', 'block')  # of specdec_jax.verifiers.REGISTRY; gains are vs 'token'
  c.workdir = '/tmp/specdec_verification'
  c.num_examples = 80
  c.batch_sizes = (1,)
  c.sort_by_length = True  # sort sources by length before batching (no effect at batch 1)
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.temperatures = (0.2, 0.6, 1.0)
  c.gammas = (4, 6, 8)
  c.seeds = (0, 1, 2)
  c.ccdf_gammas = (8,)
  c.ccdf_temperatures = (1.0,)
  c.toy_gammas = (2, 4, 8)
  c.toy_samples = 200_000  # Monte Carlo rows for verifiers without an exact toy formula
  # Sweep variants of every verifier (experiments.verification.sweep_methods): K > 1 draft paths
  # ('block/K2') and adaptive draft length ('block/stop0.5'); (1,) and () add none.
  c.num_drafts = (1,)
  c.draft_stops = ()
  variants = {'runlocal': _runlocal, 'batch': _batch, 'multipath': _multipath, 'greedy': _greedy}
  return common.parse(arg, c, variants)
