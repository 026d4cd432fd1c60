r"""Ours beside HF transformers on the same weights: greedy tokens/s, ratios, identical outputs.

  python -m benchmarks.hf_peer                                     # pretrained/ende, on a CPU
  python -m benchmarks.hf_peer --random_weights --target=t5-11b --drafters=t5-small \
      --dtype=bfloat16                                             # the paper's shapes, on a GPU

The target and each T5 drafter go to transformers' `T5ForConditionalGeneration` with the same
weights: a shipped pair through `checkpoints.save_hf_t5` and `from_pretrained` (a user's path);
random weights (`--random_weights`: `synthetic.model`, shapes from `t5.CONFIGS`, the
end-of-sequence token's output weights zeroed so that every row decodes --max_new_tokens
tokens) tensor by tensor as `save_hf_t5` would write them, from our params on JAX's device to
torch's through DLPack (`hf_from_params`: no file, no host copy; 45 GB in float32 for T5 11B).
Every method decodes the same sentences one at a time (batch 1, the paper's setting), each source
padded to --source_length with its mask, greedy, up to --max_new_tokens:

  ours         autoregressive (`decode.generate`); speculative with each drafter at --gamma
               (`decode.speculative_generate`; token and block verification are one program
               when greedy)
  transformers `generate`: default cache; `cache_implementation='static'` (compilation off); the
               static cache with `torch.compile` (--compile; transformers' own `CompileConfig`,
               on any device); assisted generation with each drafter (`assistant_model=`, exactly
               --gamma drafts an iteration: a constant schedule and no confidence stop)

Each method decodes the first sentence once untimed (compilation, lazy set-up), then every
sentence in turn, timed (`timing.timed`, which raises if JAX compiles meanwhile; ours bring each
output to the host before cutting it to its length); tokens/s counts the tokens emitted (EOS
included) over that time.
`identical` counts the sentences whose tokens equal ours autoregressive. A method that raises
gets its row with the error instead of numbers; a drafter transformers cannot run as an
assistant (a decoder over the target's encoder, `num_encoder_layers=0`, such as the shipped
`distilled` drafters; an n-gram) gets a row saying so. `--drafters=target` drafts with the target
itself, a sanity row. One timed pass per method, in turn: on a shared machine the ratios are
noisy, and torch's threads compete with the rest of the machine (--torch_threads).
"""

import dataclasses
import functools
import os
import pathlib
import tempfile

import jax
import numpy as np
import torch
import transformers
from absl import flags

import benchmarks
from benchmarks import synthetic
from specdec_jax import checkpoints, decode
from specdec_jax.checkpoints import common as checkpoint_utils
from specdec_jax.checkpoints import hf as checkpoints_hf
from specdec_jax.measure import tables, timing
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'ende', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_DRAFTERS = flags.DEFINE_list(
  'drafters',
  None,
  "Drafters: the pair's names (default: its T5 drafters) or, with --random_weights, t5.CONFIGS "
  "names (default: t5-small); 'target' drafts with the target itself.",
  flag_values=FLAGS,
)
_GAMMA = flags.DEFINE_integer(
  'gamma', None, "Drafts per iteration (default: the pair's greedy).", flag_values=FLAGS
)
_NUM = flags.DEFINE_integer(
  'num_sentences', 30, 'Sentences (test sentences of the pair).', flag_values=FLAGS
)
_MAX_NEW = flags.DEFINE_integer(
  'max_new_tokens', 64, 'Most new tokens per sentence.', flag_values=FLAGS
)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 64, 'Padded source length.', flag_values=FLAGS
)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'float32', ['float32', 'bfloat16'], 'Params and compute.', flag_values=FLAGS
)
_RANDOM = flags.DEFINE_bool(
  'random_weights', False, 'Random models of --target / --drafters.', flag_values=FLAGS
)
_TARGET = flags.DEFINE_string(
  'target', 't5-11b', 'With --random_weights: a t5.CONFIGS name.', flag_values=FLAGS
)
_COMPILE = flags.DEFINE_bool(
  'compile', True, "Also transformers' static cache + torch.compile.", flag_values=FLAGS
)
_THREADS = flags.DEFINE_integer(
  'torch_threads', 0, "torch's CPU threads (0: torch's default).", flag_values=FLAGS
)
_DEVICE = flags.DEFINE_string(
  'torch_device', None, "torch's device (default: cuda if present).", flag_values=FLAGS
)

GREEDY = SamplingConfig(temperature=0.0)


@dataclasses.dataclass
class Result:
  """One row: a method's outputs (token ids per sentence, EOS included) and timed seconds, or
  why it has none."""

  system: str
  method: str
  drafter: str = '-'
  outputs: list[list[int]] | None = None
  seconds: float = 0.0
  note: str = ''


def hf_runnable(drafter) -> str | None:
  """Why transformers cannot run `drafter` as an assistant model, or None if it can."""
  if not isinstance(drafter, t5.T5Model):
    return f'{type(drafter).__name__}: transformers has no such assistant'
  if not drafter.has_encoder:
    return "a decoder over the target's encoder (num_encoder_layers=0): no HF equivalent"
  return None


def hf_from_directory(directory, *, device, dtype):
  """transformers' model of a `checkpoints.save_hf_t5` directory."""
  model = transformers.T5ForConditionalGeneration.from_pretrained(directory)
  return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def hf_from_params(model: t5.T5Model, *, device, dtype):
  """transformers' model of `model`, with the weights `save_hf_t5` would write, built on the meta
  device and filled tensor by tensor from our params where they are: each transposed and cast
  on JAX's device where transformers stores it otherwise (a jitted function), then shared with
  torch through DLPack (no copy when torch's device is JAX's). No file, no random init, no host
  copy: at 11B a host copy of every weight took minutes (issue 40)."""
  config = transformers.T5Config(**checkpoints_hf.config_to_hf(model.config))
  with torch.device('meta'):
    hf = transformers.T5ForConditionalGeneration(config)
  names = checkpoints_hf.hf_names(model.config)
  flat = checkpoint_utils.flatten(model.params)
  checkpoint_utils.check_shapes(flat, model.config, names)
  state = {}
  for ours_name, (name, transposed) in names.items():
    array = flat[ours_name]
    if transposed or array.dtype != dtype:
      array = _as_stored(array, transposed=transposed, dtype=dtype)
    state[name] = torch.from_dlpack(array).to(device)
  # The copies transformers ties to `shared.weight` (`tie_weights` would tie the output layer
  # too: transformers 5's T5Config reads every T5 as tied).
  tied = ['encoder.embed_tokens.weight', 'decoder.embed_tokens.weight']
  if model.config.tie_word_embeddings:
    tied.append('lm_head.weight')
  state.update({name: state['shared.weight'] for name in tied})
  hf.load_state_dict(state, strict=True, assign=True)
  left = [name for name, x in [*hf.named_parameters(), *hf.named_buffers()] if x.is_meta]
  if left:
    raise ValueError(f'transformers T5 from our params: {left} left unset.')
  return hf.eval()


@functools.partial(jax.jit, static_argnames=('transposed', 'dtype'))
def _as_stored(array, *, transposed: bool, dtype: str):
  """`array` as transformers stores it: transposed (a kernel [in, out] -> its [out, in]), in
  `dtype`, row-major."""
  return (array.T if transposed else array).astype(dtype)


def timed(decode_one, sources) -> tuple[list[list[int]], float]:
  """Outputs of `decode_one(i)` for every source (after one untimed call on the first) and the
  seconds they took (`timing.timed`: raises if JAX compiles while they run)."""
  decode_one(0)
  return timing.timed(lambda: [decode_one(i) for i in range(len(sources))], 'decoding every source')


def ours(target, drafter, ids, mask, *, gamma: int, max_new_tokens: int):
  """`decode_one(i)` of our autoregressive (drafter None) or speculative loop."""
  kw = dict(sampling=GREEDY, max_new_tokens=max_new_tokens, rng=jax.random.key(0))

  def decode_one(i):
    row = (ids[i : i + 1], mask[i : i + 1])
    if drafter is None:
      out = decode.generate(target, *row, **kw)
    else:
      out = decode.speculative_generate(target, drafter, *row, gamma=gamma, **kw)
    # To the host first, then cut: x[0, :n] of a device array compiles programs for each new n.
    tokens, lengths = jax.device_get((out.tokens, out.lengths))
    return tokens[0, : lengths[0]].tolist()

  return decode_one


def hf(model, ids, mask, *, max_new_tokens: int, eos_id: int, **kwargs):
  """`decode_one(i)` of transformers' greedy `generate` with `kwargs`; the tokens after the
  decoder start, cut after the first EOS."""
  device = model.device

  def decode_one(i):
    with torch.no_grad():
      out = model.generate(
        input_ids=torch.as_tensor(ids[i : i + 1], device=device),
        attention_mask=torch.as_tensor(mask[i : i + 1].astype(np.int64), device=device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        **kwargs,
      )
    tokens = out[0, 1:].tolist()
    return tokens[: tokens.index(eos_id) + 1] if eos_id in tokens else tokens

  return decode_one


def as_assistant(model, gamma: int):
  """`model` set to draft exactly `gamma` tokens an iteration (transformers reads these from the
  assistant's own generation config, not from `generate`'s arguments)."""
  model.generation_config.num_assistant_tokens = gamma
  model.generation_config.num_assistant_tokens_schedule = 'constant'
  model.generation_config.assistant_confidence_threshold = 0.0
  return model


def run(result: Result, make_decode_one, sources) -> Result:
  """`result` with the outputs and seconds of `make_decode_one()`'s decoder, or the error it
  raised (loading a model included): a transformers row."""
  try:
    result.outputs, result.seconds = timed(make_decode_one(), sources)
  except Exception as error:  # noqa: BLE001 (a peer's failure is a result, not a crash)
    first = str(error).strip().splitlines()
    result.note = f'failed: {type(error).__name__}: {first[0] if first else ""}'[:160]
  return result


def _models_and_sources():
  """(target, {drafter name: drafter}, ids int32[N, S], mask int32[N, S], gamma, label)."""
  names = _DRAFTERS.value
  s, n = _SOURCE_LENGTH.value, _NUM.value
  if _RANDOM.value:
    target_config = synthetic.shape(_TARGET.value)
    configs = {
      name: target_config if name == 'target' else synthetic.shape(name)
      for name in names or ['t5-small']
    }
    for name, config in configs.items():
      if config.vocab_size != target_config.vocab_size:
        raise ValueError(f'Drafter {name!r} does not share the target vocabulary.')
    target = synthetic.model(target_config, dtype=_DTYPE.value, seed=0)
    found = {
      name: target if name == 'target' else synthetic.model(config, dtype=_DTYPE.value, seed=i + 1)
      for i, (name, config) in enumerate(configs.items())
    }
    vocab = target.config.vocab_size
    ids = np.random.default_rng(0).integers(2, vocab, (n, s), dtype=np.int32)
    label = f'random {_TARGET.value}'
    return target, found, ids, np.ones_like(ids), _GAMMA.value or 4, label
  pair = benchmarks.load_pair(_DIR.value)  # ours decode in the main job's layout
  default = [name for name, d in pair.drafters.items() if isinstance(d, t5.T5Model)]
  found = {}
  for name in names or default:
    if name != 'target' and name not in pair.drafters:
      raise ValueError(f'{pair.directory} has no drafter {name!r}; it has {sorted(pair.drafters)}.')
    found[name] = pair.target if name == 'target' else pair.drafters[name]
  found = {name: synthetic.with_dtype(d, _DTYPE.value) for name, d in found.items()}
  sources = [src for src, _ in pair.test_pairs()[:n]]
  ids, mask = pair.tokenizer.encode_batch(sources, s, truncate=True)
  target = synthetic.with_dtype(pair.target, _DTYPE.value)
  gamma = _GAMMA.value or pair.gamma(0.0)
  return target, found, ids, mask.astype(np.int32), gamma, str(pair.directory.name)


def transformers_results(
  target, found: dict, ids, mask, tmp: pathlib.Path, device: str, *, gamma: int, max_new_tokens: int
) -> list[Result]:
  """transformers' rows: greedy `generate` (default cache, static, static + compile) and
  assisted generation with each drafter it can run; each model loaded when its row first needs it
  (a load that fails fails its rows)."""
  loaded = {}

  def load(model, name):
    if name not in loaded:
      if _RANDOM.value:
        loaded[name] = hf_from_params(model, device=device, dtype=_DTYPE.value)
      else:
        checkpoints.save_hf_t5(model, tmp / name)
        loaded[name] = hf_from_directory(tmp / name, device=device, dtype=_DTYPE.value)
    return loaded[name]

  decoding = dict(max_new_tokens=max_new_tokens, eos_id=target.config.eos_token_id)
  compile_config = transformers.CompileConfig()
  # `generate` compiles only on an accelerator unless this is set, and transformers (5.23) has no
  # public switch for it: `_compile_all_devices` is the flag its own tests set "to compile on e.g.
  # CPU" (generation/configuration_utils.py). Set, the compiled row exists on a CPU too, where a
  # GPU would compile anyway; on a GPU it changes nothing. Private: a transformers release may drop
  # it (the row then runs uncompiled on a CPU, as `generate` decides).
  compile_config._compile_all_devices = True
  variants = {
    'greedy': {},
    'greedy-static': dict(cache_implementation='static', disable_compile=True),
    'greedy-static-compiled': dict(cache_implementation='static', compile_config=compile_config),
  }
  if not _COMPILE.value:
    del variants['greedy-static-compiled']
  results = []
  for method, kwargs in variants.items():
    make = lambda kwargs=kwargs: hf(load(target, 'target'), ids, mask, **decoding, **kwargs)
    results.append(run(Result('transformers', method), make, ids))
  for name, drafter in found.items():
    result = Result('transformers', 'assisted', name, note=hf_runnable(drafter) or '')
    if result.note:
      results.append(result)
      continue

    def make(drafter=drafter, name=name):
      # Its own instance even for the target drafting itself: the assistant's settings are its
      # generation config's.
      assistant = as_assistant(load(drafter, f'assistant-{name}'), gamma)
      return hf(load(target, 'target'), ids, mask, assistant_model=assistant, **decoding)

    results.append(run(result, make, ids))
  return results


def main(argv):
  del argv
  # JAX and torch share an accelerator: JAX takes memory as it needs it, not 75% up front.
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  benchmarks.start()  # before JAX starts
  benchmarks.quiet_checkpoint_logs()  # orbax logs every file it reads at INFO
  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  device = _DEVICE.value or ('cuda' if torch.cuda.is_available() else 'cpu')
  target, found, ids, mask, gamma, label = _models_and_sources()
  max_new, kw = _MAX_NEW.value, dict(gamma=gamma, max_new_tokens=_MAX_NEW.value)
  hf_kind = torch.cuda.get_device_name() if device == 'cuda' else 'cpu'
  print(
    f'{label}: {len(ids)} sentences, source {ids.shape[1]}, up to {max_new} new tokens, greedy, '
    f'batch 1, {_DTYPE.value}, gamma {gamma}; JAX {jax.__version__} on '
    f'{jax.devices()[0].device_kind}, transformers {transformers.__version__} / torch '
    f'{torch.__version__} on {hf_kind} ({torch.get_num_threads()} CPU threads)',
    flush=True,
  )
  # Ours raise (a failure of ours is a bug); transformers' failures are rows.
  results = [
    Result('ours', 'autoregressive', '-', *timed(ours(target, None, ids, mask, **kw), ids))
  ]
  for name, drafter in found.items():
    outputs, seconds = timed(ours(target, drafter, ids, mask, **kw), ids)
    results.append(Result('ours', 'speculative', name, outputs, seconds))
  with tempfile.TemporaryDirectory() as tmp:
    results += transformers_results(target, found, ids, mask, pathlib.Path(tmp), device, **kw)
  print(tables.format_table(summary_rows(results), COLUMNS), flush=True)


def summary_rows(results: list[Result]) -> list[dict]:
  """The printed rows: tokens/s, ms a token, ratios to ours autoregressive and to transformers'
  default greedy, and sentences identical to ours autoregressive."""

  def speed(result):
    if result.outputs is None:
      return None
    return sum(map(len, result.outputs)) / result.seconds if result.seconds else None

  reference = results[0].outputs
  base = speed(results[0])
  hf_greedy = next((speed(r) for r in results if r.method == 'greedy'), None)
  rows = []
  for r in results:
    tps = speed(r)
    same = None
    if r.outputs is not None:
      same = f'{sum(a == b for a, b in zip(r.outputs, reference))}/{len(reference)}'
    rows.append(
      dict(
        system=r.system,
        method=r.method,
        drafter=r.drafter,
        tokens_per_s=tps,
        ms_per_token=1e3 / tps if tps else None,
        vs_ours=tps / base if tps and base else None,
        vs_hf=tps / hf_greedy if tps and hf_greedy else None,
        identical=same,
        note=r.note,
      )
    )
  return rows


_Col = tables.Column
COLUMNS = (
  _Col('system', align='<', width=12),
  _Col('method', align='<', width=22),
  _Col('drafter', align='<', width=9),
  _Col('tokens_per_s', 'tokens/s', '.1f', 9),
  _Col('ms_per_token', 'ms/token', '.3f', 9),
  _Col('vs_ours', 'vs ours AR', '.2f', suffix='x'),
  _Col('vs_hf', 'vs HF greedy', '.2f', suffix='x'),
  _Col('identical', align='>', width=9),
  _Col('note', align='<', width=4),
)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
