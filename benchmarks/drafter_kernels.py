r"""A drafter's decoder step, kernel by kernel: what its compiled program launches.

  python -m benchmarks.drafter_kernels --model=t5-small               # this backend (CPU here)
  python -m benchmarks.drafter_kernels --compile_for=h100             # XLA:GPU, without a GPU
  python -m benchmarks.drafter_kernels --compile_for=h100 --target=t5-11b  # + a whole iteration
  python -m benchmarks.drafter_kernels --baseline=/tmp/base           # another checkout beside
  python -m benchmarks.drafter_kernels --time --target=t5-11b         # on a device: ms, c
  python -m benchmarks.drafter_kernels --model=t5-11b --compile_for=h100 --gemms --nounrolled
  python -m benchmarks.drafter_kernels --model=block --target=t5-11b --compile_for=h100
      # a block drafter (paper_scale's shape): its one call of gamma drafts, and the iteration

Compiles, for one row over a source of --source_length, (1) a decoder step: `t5.decode` of one
token on a cache from `t5.init_cache` (the cache donated, as the decode loops carry it), and (2)
the drafter's gamma drafts as `decode_steps.draft` makes them (greedy): its `lax.scan`, and the
same with the scan unrolled (`draft(..., unroll_draft=True)`; `--nounrolled` skips it). For each
optimized HLO module it counts what a device launches: the instructions of the entry computation
and of the computations it runs (while bodies and conditions, calls, branches), except those
that launch nothing (parameters, constants, tuples, get-tuple-element, bitcasts); a fusion counts
once. Columns: 'a call' (a loop's body and condition counted once an iteration: the scan runs
gamma - 1), 'a step' (a call over its drafter calls: 1, or gamma), 'a layer', 'in loop' (the
scan's body: one drafter step and its argmax), 'ops' (the HLO's launching instructions, a loop
body once) and their kinds: fusions, GEMMs (dots, convolutions, GEMM fusions and custom calls),
copies and transposes, while loops, other custom calls, the rest; 'stablehlo': the step's ops
before XLA optimizes it (backend-independent). With --target, one greedy iteration of
`speculative_generate`'s loop (a target pass, gamma drafts, verification), counted the same way,
and the copies of >= 2**20 elements in its loops (a copy of weights each iteration); with
--unrolled also the loop of `speculative_generate(..., unroll_draft=True)`, its scan unrolled.

The counts are the compiling backend's: XLA:CPU's fusion and layout passes are not XLA:GPU's.
`--compile_for=h100` compiles for an H100 wherever this runs, a CPU included (JAX's compile-only
devices; nothing runs). It needs the CUDA plugin of the installed jaxlib, not the CUDA
libraries: `pip install --target /tmp/gpu_site jax-cuda13-plugin==0.10.2
jax-cuda13-pjrt==0.10.2`, then `PYTHONPATH=/tmp/gpu_site`. No autotuning runs: a real device may
pick other GEMM tilings, and split-K or not (one reduction kernel more or less a GEMM).

`--gemms` prints the step's GEMMs grouped by the arguments they read (`gemms`, `gemm_table`:
each GEMM's bytes, its operands whole or the slices it takes), e.g. for a target: `--model=t5-11b
--compile_for=h100 --gemms`. `--profile=DIR` (with --time) writes a `jax.profiler` trace of
the timed loops, every kernel of the step with its device time.

`--baseline=DIR` makes the same measurements in a child process whose `specdec_jax` is DIR's (a
checkout of another commit: `git worktree add /tmp/base COMMIT`) and prints both. `--time`
(a device; not with --compile_for) times a step inside a jitted loop (`timing.step_seconds`,
random weights) and, with --target, the target's step and c = drafter step / target step.
XLA_FLAGS are passed on as set (the header prints them).

Measured on 2 cores of an AMD EPYC (family 26), 2026-11-26, jaxlib 0.10.2, t5-small in bfloat16
(source 64, cache 128, gamma 4): docs/performance.md, "The small drafter's step, kernel by
kernel".
"""

import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
from absl import app, flags

import benchmarks
from benchmarks import hlo_text, machines, synthetic
from specdec_jax import decode, decode_steps
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing, xla_cpu
from specdec_jax.models import t5

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_MODEL = flags.DEFINE_string(
  'model',
  't5-small',
  'The drafter: a name in t5.CONFIGS, or one-layer[:NAME] / block[:NAME] over --target '
  "(paper_scale's drafter shapes; block needs --target).",
  flag_values=FLAGS,
)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'bfloat16', ['bfloat16', 'float32'], 'Params and compute.', flag_values=FLAGS
)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 64, 'Source tokens (all real).', flag_values=FLAGS
)
_CACHE_LEN = flags.DEFINE_integer('cache_len', 128, 'Decoder cache slots.', flag_values=FLAGS)
_GAMMA = flags.DEFINE_integer('gamma', 4, 'Drafts per draft loop.', flag_values=FLAGS)
_UNROLLED = flags.DEFINE_bool(
  'unrolled',
  True,
  'Also count the draft loop (and the --target iteration) with its scan unrolled.',
  flag_values=FLAGS,
)
_COMPILE_FOR = benchmarks.define_compile_for('One GPU chip (h100).', FLAGS)
_TIME = flags.DEFINE_bool(
  'time', False, 'Also time a step inside a jitted loop (a device).', flag_values=FLAGS
)
_TARGET = flags.DEFINE_string(
  'target',
  None,
  'A target (t5.CONFIGS name): count a speculative iteration; with --time, c.',
  flag_values=FLAGS,
)
_BASELINE = flags.DEFINE_string(
  'baseline', None, 'A checkout whose specdec_jax to compare.', flag_values=FLAGS
)
_HLO_DIR = flags.DEFINE_string(
  'hlo_dir', None, "Write each program's optimized HLO here.", flag_values=FLAGS
)
_JSON = flags.DEFINE_bool(
  'json', False, 'Print the measurements as one JSON line.', flag_values=FLAGS
)
_GEMMS = flags.DEFINE_bool(
  'gemms', False, "Print the step's GEMMs: what each reads, in MB.", flag_values=FLAGS
)
_PROFILE = flags.DEFINE_string(
  'profile', None, 'With --time: write a jax.profiler trace of the timing here.', flag_values=FLAGS
)

_SYMBOL = r'"[^"]+"|[\w.$\-]+'  # a StableHLO function's name, quoted or not


def stablehlo_ops(text: str, op: str | None = None) -> int:
  """Ops (all but constants and returns, or only `op`, e.g. 'dot_general') that lowered StableHLO
  text runs: its public function's, a private function's once per call; a loop body's once."""
  funcs, name = {}, None
  for line in text.splitlines():
    match = re.match(rf'\s*func\.func (?:public |private )?@({_SYMBOL})', line)
    if match:
      name = match.group(1)
      funcs[name] = []
    elif name is not None:
      funcs[name].append(line)
  counted = {}

  def ops(name):
    if name not in counted:
      body = '\n'.join(funcs[name])
      own = re.findall(r'= "?stablehlo\.([\w.]+)', body)
      own = (
        [o for o in own if o == op] if op else [o for o in own if o not in ('constant', 'return')]
      )
      counted[name] = len(own) + sum(map(ops, re.findall(rf'call @({_SYMBOL})', body)))
    return counted[name]

  return ops('main')


def _draft(steps, gamma: int, unrolled: bool):
  """`decode_steps.draft` as a function of (params, cache, seq, n), its scan unrolled or not."""

  def run(params, cache, seq, n):
    key = jax.random.key(0)
    kw = dict(gamma=gamma, sampling=None, greedy=True, unroll_draft=unrolled)
    return decode_steps.draft(steps, params, cache, seq, n, key, **kw)[:3]

  return run


def _block_call(steps, gamma: int):
  """A block drafter's one call of the loop as a function of (params, cache, tokens, features,
  num_kept): gamma + 1 kept positions, gamma drafts (`T5Steps.step_block`)."""

  def run(params, cache, tokens, features, num_kept):
    return steps.step_block(params, tokens, features, cache, gamma, num_kept)

  return run


def count(config, *, source_length, cache_len, gamma, unrolled=True, device=None, hlo_dir=None):
  """The step and the draft loop(s) of `config`'s decoder, compiled for `device` (default: the
  default backend): {program: {'launches': what its HLO holds, by category (a loop body once);
  'per_call': what one call launches (the scan's body and condition once an iteration);
  'per_step': per_call over its drafter calls (gamma for a draft loop); 'per_layer';
  'loop_body': the scan's body alone (one drafter step and its argmax); 'stablehlo'}}. A block
  drafter (`config.block_size`) has its one call instead of the draft loops ('block call': its
  gamma drafts in one call, no loop)."""
  model = synthetic.abstract_model(config, device)
  params = model.params
  cache = synthetic.abstract_cache(model, device, batch=1, source_length=source_length,
                                   cache_len=cache_len)  # fmt: skip
  token = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  seq = jax.ShapeDtypeStruct((1, cache_len), jnp.int32)
  n = jax.ShapeDtypeStruct((1,), jnp.int32)
  if device is not None:
    on = jax.sharding.SingleDeviceSharding(device)
    place = lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on)
    token, seq, n = jax.tree.map(place, (token, seq, n))
  # A drafter reading the target's states (feature_dim) gets them beside its token.
  feature = None
  if config.feature_dim:
    feature = jax.ShapeDtypeStruct((1, 1, config.feature_dim), jnp.float32, **_on(device))
  step = jax.jit(lambda p, t, f, c: t5.decode(p, t, c, config=config, features=f), donate_argnums=3)
  programs = {}
  if not config.block_size:  # a block drafter has no one-token step: its call is below
    programs['step'] = (step.lower(params, token, feature, cache), None)
  steps = t5.T5Model(config=config, params=None).steps
  if config.block_size:
    width = jax.ShapeDtypeStruct((1, gamma + 1), jnp.int32, **_on(device))
    features = jax.ShapeDtypeStruct((1, gamma + 1, config.feature_dim), jnp.float32, **_on(device))
    fn = jax.jit(_block_call(steps, gamma), donate_argnums=1)
    programs['block call'] = (fn.lower(params, cache, width, features, n), 'block')
  draft_loops = () if config.block_size else (False, True)[: 1 + unrolled]
  for unroll in draft_loops:
    fn = jax.jit(_draft(steps, gamma, unroll), donate_argnums=1)
    programs[f'draft loop ({"unrolled" if unroll else "scan"})'] = (
      fn.lower(params, cache, seq, n),
      unroll,
    )
  out = {}
  for name, (lowered, unroll) in programs.items():
    hlo = lowered.compile().as_text()
    if hlo_dir:
      os.makedirs(hlo_dir, exist_ok=True)
      with open(os.path.join(hlo_dir, re.sub(r'\W+', '_', name).strip('_') + '.hlo'), 'w') as f:
        f.write(hlo)
    static = hlo_text.launches(hlo)
    per_call, in_loop = static['total'], None
    loops = hlo_text.while_loops(hlo)
    if unroll is False:  # the scan: gamma - 1 iterations (gamma tests of its condition)
      if len(loops) != 1:
        raise ValueError(f'Expected the draft loop to compile to one while loop, got {len(loops)}.')
      body, condition = (hlo_text.launches(hlo, c)['total'] for c in loops[0])
      per_call += (gamma - 2) * body + (gamma - 1) * condition
      in_loop = body
    elif loops:
      raise ValueError(f'{name} compiled to {len(loops)} while loops, expected none.')
    calls = 1 if unroll in (None, 'block') else gamma
    out[name] = dict(
      launches=dict(static),
      per_call=per_call,
      per_step=per_call / calls,
      per_layer=per_call / calls / config.num_decoder_layers,
      loop_body=in_loop,
      stablehlo=stablehlo_ops(lowered.as_text()) if unroll in (None, 'block') else None,
      gemms=gemm_table(gemms(hlo)) if unroll is None else None,
    )
  return out


def _on(device) -> dict:
  """`ShapeDtypeStruct` keywords placing an argument on `device` (none for the default one)."""
  return {} if device is None else dict(sharding=jax.sharding.SingleDeviceSharding(device))


_DEFINITION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = \(?([a-z]+[0-9]*)\[([\d,]*)\]')
_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'f32': 4, 's32': 4, 'u32': 4}


def _operands(rest: str) -> list[str]:
  """The names an instruction's operand list (the text after its opcode's '(') refers to."""
  depth, end = 1, 0
  for end, char in enumerate(rest):
    depth += {'(': 1, ')': -1}.get(char, 0)
    if depth == 0:
      break
  return re.findall(r'%([\w.\-]+)', rest[:end])


def gemms(hlo: str, computation: str | None = None) -> list[dict]:
  """Each GEMM that `computation` (default: the entry) of an optimized HLO module launches, the
  computations it runs included (a loop body once), in order: {'name'; 'inputs': the program's
  arguments it reads directly or through bitcasts (names as JAX gives them, e.g.
  'p__decoder____layers_0____mlp____wi____kernel__.1' for params passed as `p`; none inside a
  loop body, which reads its carry); 'bytes': what it reads and writes, each operand whole or,
  where its fused computation slices it, the slice}."""
  comps, entry = hlo_text.computations(hlo)
  arguments = {
    m.group(1)
    for line in comps[entry]
    if (m := re.match(r'\s*%?([\w.\-]+) = .* parameter\(', line))
  }
  shapes, lines = {}, {}
  for body in comps.values():
    for line in body:
      match = _DEFINITION.match(line)
      if match:
        dims = [int(d) for d in match.group(3).split(',') if d]
        shapes[match.group(1)] = _BYTES.get(match.group(2), 0) * math.prod(dims)
        lines[match.group(1)] = line

  def parameter(name):  # the program argument `name` is, through bitcasts, or None
    line = lines.get(name, '')
    if name in arguments:
      return name
    source = re.search(r' bitcast\(%?([\w.\-]+)\)', line)
    return parameter(source.group(1)) if source else None

  def read(operand, index, called):  # bytes of operand `index` that a fused computation reads
    if called in comps:
      names = [
        m.group(1)
        for line in comps[called]
        if (m := re.match(rf'\s*%?([\w.\-]+) = \S+ parameter\({index}\)', line))
      ]
      for line in comps[called]:
        sliced = re.search(r' (?:dynamic-slice|slice)\(%?([\w.\-]+)', line)
        if names and sliced and sliced.group(1) == names[0]:
          return shapes.get(_DEFINITION.match(line).group(1), 0)
    return shapes.get(operand, 0)

  out = []

  def visit(name):
    for line in comps[name]:
      match = hlo_text.instruction(line)
      if not match or match.group(3) in hlo_text.FREE:
        continue
      _, _, opcode, rest = match.groups()
      for sub in hlo_text.called(opcode, rest):
        visit(sub)
      if hlo_text.category(opcode, rest) != 'gemm':
        continue
      called = re.search(r'calls=%?([\w.\-]+)', rest.split('metadata=')[0])
      called = called and called.group(1)
      operands = _operands(rest)
      result = _DEFINITION.match(line).group(1)
      out.append(
        dict(
          name=result,
          inputs=[w for w in map(parameter, operands) if w],
          bytes=shapes.get(result, 0) + sum(read(o, i, called) for i, o in enumerate(operands)),
        )
      )

  visit(computation or entry)
  return out


def gemm_table(found: list[dict]) -> list[dict]:
  """`gemms` grouped by the arguments they read (params as their paths, layer indices as N):
  [{'inputs', 'launches', 'mbytes' (the largest), 'total_mbytes'}], largest total first."""
  groups = collections.defaultdict(list)
  for gemm in found:
    names = [re.sub(r'^p__|__\.\d+$|\.\d+$', '', w).replace('____', '/') for w in gemm['inputs']]
    key = ' + '.join(re.sub(r'layers_\d+', 'layers_N', n) for n in names) or '(activations)'
    groups[key].append(gemm['bytes'])
  rows = [
    dict(inputs=k, launches=len(v), mbytes=max(v) / 1e6, total_mbytes=sum(v) / 1e6)
    for k, v in groups.items()
  ]
  return sorted(rows, key=lambda r: -r['total_mbytes'])


def _elements(line: str) -> int:
  """Elements of the (first) array an HLO instruction line defines."""
  dims = re.search(r'= \(?\w+\[([\d,]*)\]', line)
  return math.prod(int(d) for d in dims.group(1).split(',') if d) if dims else 0


def iteration(
  target, drafter, *, source_length, gamma, unroll_draft=False, device=None, hlo_dir=None
) -> dict:
  """What one iteration of `speculative_generate`'s loop launches (greedy, one row): the outer
  while loop's body and condition, the draft scan in it once an iteration (gamma - 1 times; with
  `unroll_draft`, `speculative_generate(..., unroll_draft=True)`, no scan: its calls are in the
  body; a block drafter's one call is in the body too), and 'weight copies': the copies,
  transposes and concatenations in the loop of >= 2**20 elements."""
  models = [synthetic.abstract_model(config, device) for config in (target, drafter)]
  sharding = {}
  if device is not None:
    sharding = dict(sharding=jax.sharding.SingleDeviceSharding(device))
  ids = jax.ShapeDtypeStruct((1, source_length), jnp.int32, **sharding)
  sampling = sampling_lib.SamplingConfig(temperature=0.0)
  lowered = decode.lower_speculative(
    *models,
    ids,
    ids,
    gamma=gamma,
    sampling=sampling,
    max_new_tokens=64,
    unroll_draft=unroll_draft,
  )
  hlo = lowered.compile().as_text()
  if hlo_dir:
    name = 'speculative_loop_unrolled.hlo' if unroll_draft else 'speculative_loop.hlo'
    with open(os.path.join(hlo_dir, name), 'w') as f:
      f.write(hlo)
  comps, _ = hlo_text.computations(hlo)
  loops = {loop: hlo_text.while_loops(hlo, loop[0]) for loop in hlo_text.while_loops(hlo)}
  # The decode loop: the one holding the draft scan, or, with no scan (unrolled, or a block
  # drafter's one call), the one loop.
  no_scan = unroll_draft or bool(drafter.block_size)
  outer = list(loops) if no_scan else [loop for loop, inner in loops.items() if inner]
  if len(outer) != 1 or len(loops[outer[0]]) != (0 if no_scan else 1):
    held = {loop[0]: len(inner) for loop, inner in loops.items()}
    raise ValueError(
      f'Expected one decode loop holding {"no loop" if no_scan else "the draft scan"}; '
      f'the while loops (body: loops in it) are {held}.'
    )
  body, condition = outer[0]
  per_iteration = hlo_text.launches(hlo, body)['total'] + hlo_text.launches(hlo, condition)['total']
  bodies = [body]
  if not no_scan:
    ((inner_body, inner_condition),) = loops[outer[0]]
    per_iteration += (gamma - 2) * hlo_text.launches(hlo, inner_body)['total']
    per_iteration += (gamma - 1) * hlo_text.launches(hlo, inner_condition)['total']
    bodies.append(inner_body)
  copies = 0
  for name in bodies:
    for line in comps[name]:
      match = hlo_text.instruction(line)
      head = line.split('metadata=')[0]
      big = match and _elements(line) >= 2**20
      if big and (
        match.group(3) in ('copy', 'transpose', 'concatenate')
        or re.search(r'fusion\(.*calls=%?\w*(concatenate|copy|transpose)', head)
      ):
        copies += 1
  return dict(per_iteration=per_iteration, weight_copies=copies)


def drafter_shape(name: str, target: str | None, dtype: str) -> t5.T5Config:
  """--model's shape: a `t5.CONFIGS` name, or paper_scale's one-layer[:NAME] / block[:NAME]
  over `target` (`synthetic.drafter_config`; a block drafter needs a target: it reads the
  target's encoder and states)."""
  if name.partition(':')[0] not in ('one-layer', 'block'):
    return synthetic.shape(name, dtype)
  if not target:
    raise app.UsageError(f'--model={name} drafts over a target: pass --target (e.g. t5-11b).')
  config = synthetic.drafter_config(name, synthetic.shape(target, dtype))
  return dataclasses.replace(config, dtype=dtype)


def measure() -> dict:
  config = drafter_shape(_MODEL.value, _TARGET.value, _DTYPE.value)
  shape = dict(source_length=_SOURCE_LENGTH.value, cache_len=_CACHE_LEN.value)
  device = jax.devices()[0]
  compile_for = benchmarks.compile_for(_COMPILE_FOR, one_chip=True)
  if compile_for:
    try:
      (device,) = machines.compile_only_devices(compile_for)
    except RuntimeError as e:
      raise app.UsageError(f'--compile_for={_COMPILE_FOR.value}: {e}') from e
  result = dict(
    block=bool(config.block_size),
    device=f'{device.device_kind} ({device.platform}{", compile-only" * bool(_COMPILE_FOR.value)})',
    jax=jax.__version__,
    xla_flags=os.environ.get('XLA_FLAGS', '').replace(xla_cpu.FLAG, '').strip(),
    counts=count(
      config,
      gamma=_GAMMA.value,
      unrolled=_UNROLLED.value,
      device=device if _COMPILE_FOR.value else None,
      hlo_dir=_HLO_DIR.value,
      **shape,
    ),
  )
  if _TARGET.value:
    unrolled = _UNROLLED.value and not config.block_size  # a block call: nothing to unroll
    for key, unroll in (('iteration', False), ('iteration_unrolled', True))[: 1 + unrolled]:
      result[key] = iteration(
        synthetic.shape(_TARGET.value, _DTYPE.value),
        config,
        source_length=_SOURCE_LENGTH.value,
        gamma=_GAMMA.value,
        unroll_draft=unroll,
        device=device if _COMPILE_FOR.value else None,
        hlo_dir=_HLO_DIR.value,
      )
  if _TIME.value:
    profile = jax.profiler.trace(_PROFILE.value) if _PROFILE.value else contextlib.nullcontext()
    with profile:
      result['step_ms'] = (
        timing.step_seconds(synthetic.model(config, dtype=config.dtype), batch_size=1, **shape)
        * 1e3
      )
      if _TARGET.value:
        target = synthetic.model(synthetic.shape(_TARGET.value, _DTYPE.value), dtype=_DTYPE.value)
        result['target_step_ms'] = timing.step_seconds(target, batch_size=1, **shape) * 1e3
  return result


def _baseline(directory: str) -> dict:
  """`measure()` in a child process whose `specdec_jax` (and `benchmarks`) are `directory`'s."""
  argv = [a for a in sys.argv[1:] if not a.startswith(('--baseline', '--json', '--hlo_dir'))]
  directory = os.path.abspath(directory)
  path = os.pathsep.join([directory, *filter(None, [os.environ.get('PYTHONPATH')])])
  done = subprocess.run(
    [sys.executable, os.path.abspath(__file__), *argv, '--json'],
    env=dict(os.environ, PYTHONPATH=path),
    cwd=directory,
    capture_output=True,
    text=True,
  )
  if done.returncode:
    raise RuntimeError(f'The baseline run in {directory} failed:\n{done.stderr[-3000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  if _COMPILE_FOR.value and _TIME.value:
    raise app.UsageError('--time runs on a device; --compile_for only compiles.')
  if _COMPILE_FOR.value:  # no CUDA libraries are needed to compile, nor checked
    os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  benchmarks.start()  # before JAX starts
  result = measure()
  if _JSON.value:
    print(json.dumps(result))
    return
  runs = [('base', _baseline(_BASELINE.value))] if _BASELINE.value else []
  runs.append(('this', result))
  print(
    f'{_MODEL.value} ({_DTYPE.value}), batch 1, source {_SOURCE_LENGTH.value}, cache '
    f'{_CACHE_LEN.value}, gamma {_GAMMA.value}; compiled for {result["device"]}, jax '
    f'{result["jax"]}, XLA_FLAGS={result["xla_flags"]!r}'
  )
  kinds = ('fusion', 'gemm', 'copy', 'while', 'custom-call', 'other')
  names = ['a call', 'a step', 'a layer', 'in loop', 'ops', *kinds[:4], 'call', 'other']
  print(f'{"code":5s} {"program":22s}' + ''.join(f'{n:>8s}' for n in names) + '  stablehlo')
  for label, run in runs:
    for name, c in run['counts'].items():
      n = c['launches']
      cells = [c['per_call'], f'{c["per_step"]:.1f}', f'{c["per_layer"]:.1f}']
      cells += [c['loop_body'] or '-', n['total'], *(n.get(k, 0) for k in kinds)]
      stablehlo = c['stablehlo'] or '-'
      print(f'{label:5s} {name:22s}' + ''.join(f'{x:>8}' for x in cells) + f'  {stablehlo:>9}')
  for label, run in runs:
    step = run['counts'].get('step', {})
    if _GEMMS.value and step.get('gemms'):
      mbytes = sum(g['total_mbytes'] for g in step['gemms'])
      print(f"{label}: the step's GEMMs ({len(step['gemms'])} kinds, {mbytes:,.1f} MB in all):")
      for g in step['gemms']:
        print(
          f'  {g["launches"]:4d} x {g["mbytes"]:9.3f} MB = {g["total_mbytes"]:9.1f}  {g["inputs"]}'
        )
    scan = 'one block call' if run.get('block') else 'scan'
    for key, draft in (('iteration', scan), ('iteration_unrolled', 'unrolled')):
      if key in run:
        it = run[key]
        print(
          f'{label}: one greedy iteration of the speculative loop ({_TARGET.value} target, gamma '
          f'{_GAMMA.value}, draft {draft}) launches {it["per_iteration"]}; copies of >= 2**20 '
          f'elements in its loops: {it["weight_copies"]}'
        )
    if 'step_ms' in run:
      line = f'{label}: drafter step {run["step_ms"]:.4f} ms in a jitted loop'
      if run.get('target_step_ms'):
        c = run['step_ms'] / run['target_step_ms']
        line += f'; {_TARGET.value} step {run["target_step_ms"]:.3f} ms; c {c:.4f}'
      print(line)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
