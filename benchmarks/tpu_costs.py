"""XLA:TPU's cost model, read from a compiled program: estimated cycles by op, kind and scope.

XLA:TPU (libtpu) annotates each op it schedules with its own estimate of the op's cost:
`"estimated_cycles":"N"` in the op's backend config, in the optimized HLO (`compiled.as_text()`),
for programs compiled for a TPU on any host (`machines.compile_only_devices`; nothing runs).
These are a compiler's estimates, not timings. This module parses that text (`parse`) and sums
the estimates over a computation, its while loops multiplied by their trip counts (`Program.cycles`),
by kind of op (`kind`: MXU matmuls, GEMVs, layout copies, ...) and by the `jax.named_scope` the
decode loops put around their steps (`scope`: target, drafter, sampling, verify, emit).

What a cycle is in seconds is stated nowhere we found; `calibrate` measures it in the same
compiler: bytes a cycle of three reference programs of 256 MiB (a vector stream `x * 2`, an
8-row matmul reading a weight on the MXU, its one-row form), so a call's bytes over the matmul
rate are its HBM bound in the compiler's own model, and its cycles over that bound how far the
compiler puts it from it. `compile_lowered` compiles with a disk cache (11B programs take
minutes on a small host).

Ops that carry no estimate (parameters, tuples, bitcasts, async copy starts and dones, custom
calls, collectives) count 0. A conditional counts its most expensive branch (`Program.cycles`).
Results: docs/performance.md, "What XLA:TPU shows".
"""

import collections
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re

import jax
import jax.numpy as jnp

from benchmarks import hlo_text

_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r'\bcalls=%?([\w.\-]+)')

# The named scopes of the decode loops (decode.py, decode_steps.py), outermost first as they nest:
# the drafter's sampling is 'drafter' work's neighbour, not inside it.
SCOPES = ('encode', 'drafter', 'target', 'sampling', 'verify', 'emit')


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of an optimized HLO computation.

  Attributes:
    name: its HLO name ('fusion.12', 'copy.3').
    opcode: 'fusion', 'copy', 'while', ...
    shape: its result type as HLO writes it ('bf16[1024,65536]{0,1:T(8,128)(2,1)}').
    cycles: XLA:TPU's estimate, 0 where the op carries none.
    op_name: the JAX op name of its metadata ('jit(f)/while/body/target/...'), or ''.
    fused: for a fusion, the opcodes of its fused computation ({'convolution': 1, ...}).
    runs: computations it runs as ops of their own: a while's body and condition, a
      conditional's branches, a call's callee.
    trip_count: a while loop's known trip count, or None.
  """

  name: str
  opcode: str
  shape: str
  cycles: int
  op_name: str
  fused: tuple[tuple[str, int], ...] = ()
  runs: tuple[str, ...] = ()
  trip_count: int | None = None
  read_bytes: int = 0

  @property
  def bytes(self) -> int:
    """Bytes of what it defines (its result, every element of a tuple)."""
    return shape_bytes(self.shape)


@dataclasses.dataclass(frozen=True)
class Program:
  """An optimized HLO module: {computation name: its ops}, and the entry computation's name."""

  computations: dict[str, list[Op]]
  entry: str

  def loops(self, computation: str | None = None) -> list[Op]:
    """The while ops of `computation` (default: the entry), in order."""
    return [op for op in self.computations[computation or self.entry] if op.opcode == 'while']

  def traced_loops(self, computation: str | None = None) -> list[Op]:
    """The while ops of `computation` (default: the entry) without a known trip count: loops
    over a traced length (a decode loop, a timing loop), whose body is read per iteration."""
    return [op for op in self.loops(computation) if op.trip_count is None]

  def traced_loop(self, computation: str | None = None) -> Op:
    """The one loop of traced length of `computation` (`traced_loops`); ValueError where there
    is none or several."""
    loops = self.traced_loops(computation)
    if len(loops) != 1:
      where = 'at the top level' if computation is None else f'in {computation}'
      raise ValueError(f'Expected one loop of traced length {where}, found {len(loops)}.')
    return loops[0]

  def cycles(self, computation: str | None = None) -> int:
    """Estimated cycles of one run of `computation` (default: the entry): its ops, each while
    loop's body and condition times its known trip count (the condition once more), each
    conditional's most expensive branch, each call's callee. A loop without a known trip count
    (a decode loop, which stops when its rows do) raises ValueError: take its body's cycles."""
    return sum(self.op_cycles(op) for op in self.computations[computation or self.entry])

  def op_cycles(self, op: Op) -> int:
    """Estimated cycles of one run of `op`, with what it runs (as `cycles`)."""
    if op.opcode == 'while':
      if op.trip_count is None:
        raise ValueError(
          f'While loop {op.name} has no known trip count: read its body '
          f'({op.runs[0]}) per iteration instead.'
        )
      body, condition = op.runs
      return (
        op.cycles + op.trip_count * self.cycles(body) + (op.trip_count + 1) * self.cycles(condition)
      )
    if op.opcode == 'conditional':
      return op.cycles + max(self.cycles(branch) for branch in op.runs)
    return op.cycles + sum(self.cycles(c) for c in op.runs)

  def flat(self, computation: str | None = None, times: int = 1):
    """(op, how many times one run of `computation` runs it) for every op it runs, loops with a
    known trip count counted that many times (once without one), every branch of a conditional
    counted once."""
    for op in self.computations[computation or self.entry]:
      yield from self.flat_op(op, times)

  def flat_op(self, op: Op, times: int = 1):
    """`flat` of one op: (op, times), then what it runs."""
    yield op, times
    if op.opcode == 'while':
      body, condition = op.runs
      trips = 1 if op.trip_count is None else op.trip_count
      yield from self.flat(body, times * trips)
      yield from self.flat(condition, times * (trips + 1))
    else:
      for sub in op.runs:
        yield from self.flat(sub, times)

  def table(self, computation: str | None = None, key=None) -> dict[str, int]:
    """{key(op): cycles} over what one run of `computation` runs (`flat`), largest first."""
    key = key or kind
    totals = collections.Counter()
    for op, times in self.flat(computation):
      if op.cycles:
        totals[key(op)] += op.cycles * times
    return dict(totals.most_common())


def parse(text: str) -> Program:
  """Optimized HLO text (`compiled.as_text()`) -> `Program`."""
  lines, entry = hlo_text.computations(text)
  if entry is None:
    raise ValueError('No ENTRY computation in this HLO text: pass compiled.as_text().')
  trips = {comp: _counted_to(body) for comp, body in lines.items()}
  opcodes = {
    comp: collections.Counter(m.group(3) for m in map(hlo_text.instruction, body) if m)
    for comp, body in lines.items()
  }
  computations = {}
  for comp, body in lines.items():
    ops = []
    shapes = {}
    for line in body:
      match = hlo_text.instruction(line)
      if not match:
        continue
      name, shape, opcode, rest = match.groups()
      shapes[name] = shape
      head = rest.split(', metadata=')[0]
      operands = re.findall(r'%([\w.\-]+)', head.split(')')[0]) if opcode != 'parameter' else []
      cycles = _CYCLES.search(rest)
      trip = _TRIP_COUNT.search(rest)
      op_name = _OP_NAME.search(rest)
      runs = hlo_text.called(opcode, head)
      fused = ()
      if opcode == 'fusion':
        callee = _CALLS.search(head)
        if callee and callee.group(1) in opcodes:
          fused = tuple(sorted(opcodes[callee.group(1)].items()))
      ops.append(
        Op(
          name=name,
          opcode=opcode,
          shape=shape,
          cycles=int(cycles.group(1)) if cycles else 0,
          op_name=op_name.group(1) if op_name else '',
          fused=fused,
          runs=tuple(runs),
          trip_count=_trip_count(trip, runs, opcode, trips),
          read_bytes=sum(shape_bytes(shapes.get(o, '')) for o in operands),
        )
      )
    computations[comp] = ops
  return Program(computations, entry)


_ITEMSIZE = dict(
  pred=1, s8=1, u8=1, bf16=2, f16=2, s16=2, u16=2, f32=4, s32=4, u32=4, f64=8, s64=8, u64=8
)
_ARRAY = re.compile(r'\b([a-z]+\d*)\[([\d,]*)\]')


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO type ('bf16[2,3]{1,0}', or a tuple of them), padding of tiles not counted."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    count = 1
    for d in filter(None, dims.split(',')):
      count *= int(d)
    total += count * _ITEMSIZE.get(dtype, 0)
  return total


def _counted_to(lines: list[str]) -> int | None:
  """C when a while condition's root is `counter < C` (a get-tuple-element of its parameter
  against a constant), else None."""
  root = next((line for line in lines if line.lstrip().startswith('ROOT')), '')
  match = re.search(r'compare\(%([\w.\-]+), %([\w.\-]+)\), direction=LT', root)
  if not match:
    return None
  constants, counters = {}, set()
  for line in lines:
    defined = hlo_text.instruction(line)
    if not defined:
      continue
    value = re.match(r'constant\((-?\d+)\)', f'{defined.group(3)}({defined.group(4)}')
    if value and defined.group(2).startswith('s32[]'):
      constants[defined.group(1)] = int(value.group(1))
    elif defined.group(3) == 'get-tuple-element':
      counters.add(defined.group(1))
  counter, bound = match.groups()
  return constants.get(bound) if counter in counters else None


def _trip_count(annotated, runs, opcode, counted_to) -> int | None:
  """A while loop's trip count: XLA's annotation where it wrote one, else the bound of a
  `counter < C` condition (JAX's scans and static fori_loops count from 0), else None."""
  if opcode != 'while':
    return None
  if annotated:
    return int(annotated.group(1))
  return counted_to.get(runs[1]) if len(runs) > 1 else None


# What `kind` returns, in the order tables list them.
KINDS = (
  'matmul (MXU)',
  'gemv (multiply+reduce)',
  'layout copy',
  'cache write',
  'reduction',
  'elementwise / other',
  'loop control',
)


def kind(op: Op) -> str:
  """What an op is, for tables: 'matmul (MXU)' (a fusion holding a convolution: XLA:TPU's dots
  on the matrix unit), 'gemv (multiply+reduce)' (a dot with a one-row operand that XLA:TPU
  rewrote as an elementwise multiply and a reduction, on the vector units), 'layout copy' (a copy
  or transpose, alone or fused with bitcasts: data moved to another layout), 'cache write'
  (scatters and dynamic-update-slices), 'reduction', 'elementwise / other', 'loop control'."""
  fused = dict(op.fused)
  ops = set(fused) - {'parameter', 'bitcast', 'constant', 'tuple', 'get-tuple-element'}
  if op.opcode in ('convolution', 'dot') or 'convolution' in ops or 'dot' in ops:
    return 'matmul (MXU)'
  if op.opcode == 'fusion' and 'reduce' in ops and 'multiply' in ops:
    return 'gemv (multiply+reduce)'
  if op.opcode in ('copy', 'transpose') or (op.opcode == 'fusion' and ops <= {'copy', 'transpose'}):
    return 'layout copy'
  if op.opcode in ('scatter', 'dynamic-update-slice') or ops & {'scatter', 'dynamic-update-slice'}:
    return 'cache write'
  if op.opcode in ('while', 'conditional', 'call') or op.op_name.endswith(('/while', '/cond')):
    return 'loop control'
  if op.opcode == 'reduce' or 'reduce' in ops:
    return 'reduction'
  return 'elementwise / other'


def scope(op: Op) -> str:
  """The decode loops' named scope an op belongs to (`SCOPES`: the last one its op name holds,
  so the drafter's sampling is 'sampling'), or 'loop' for the loop's own work outside them."""
  parts = op.op_name.split('/')
  found = [p for p in parts if p in SCOPES]
  return found[-1] if found else 'loop'


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A program compiled for a TPU: its optimized HLO and XLA:TPU's memory analysis (bytes)."""

  text: str
  argument_bytes: int
  temp_bytes: int

  @functools.cached_property
  def program(self) -> Program:
    return parse(self.text)


def versions() -> str:
  """'jax 0.10.2, libtpu 0.0.42.1': what compiled (a cache key part, and the tables' header),
  with LIBTPU_INIT_ARGS where set (libtpu reads its compiler flags there)."""
  try:
    libtpu = importlib.metadata.version('libtpu')
  except importlib.metadata.PackageNotFoundError:
    libtpu = 'absent'
  flags_ = os.environ.get(_LIBTPU_ARGS)
  return f'jax {jax.__version__}, libtpu {libtpu}' + (
    f', {_LIBTPU_ARGS}={flags_}' if flags_ else ''
  )


def compile_lowered(
  lowered: jax.stages.Lowered,
  *,
  tag: str,
  options: dict | None = None,
  cache_dir: str | None = None,
) -> Compiled:
  """`lowered.compile(compiler_options=options)` as a `Compiled`, cached in `cache_dir` (None: no
  cache) under a hash of the lowered program, `tag` (name the machine: the lowered text does not),
  the options, the versions and LIBTPU_INIT_ARGS. An 11B program takes 20-100 s to compile on 2
  CPU cores."""
  options = dict(options or {})
  path = None
  if cache_dir:
    key = json.dumps(
      [lowered.as_text(), tag, sorted(options.items()), versions(), os.environ.get(_LIBTPU_ARGS)]
    )
    path = os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest() + '.json')
    if os.path.exists(path):
      with open(path) as f:
        return Compiled(**json.load(f))
  compiled = lowered.compile(compiler_options=options or None)
  memory = compiled.memory_analysis()
  out = Compiled(compiled.as_text(), memory.argument_size_in_bytes, memory.temp_size_in_bytes)
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + '.tmp', 'w') as f:
      json.dump(dataclasses.asdict(out), f)
    os.replace(path + '.tmp', path)
  return out


_LIBTPU_ARGS = 'LIBTPU_INIT_ARGS'


def compile_text(fn, *args, **jit_kwargs) -> str:
  """`jax.jit(fn, **jit_kwargs).lower(*args).compile().as_text()`: args are ShapeDtypeStructs
  placed on compile-only devices."""
  return jax.jit(fn, **jit_kwargs).lower(*args).compile().as_text()


# ---------------------------------------------------------------------------------------------
# The unit of a cycle, in the same compiler.


@dataclasses.dataclass(frozen=True)
class Calibration:
  """Bytes per estimated cycle of three reference programs compiled for one device.

  Attributes:
    stream: bytes moved (read + written) a cycle by `x * 2` over a bf16 vector: the vector
      units' stream.
    matmul: weight bytes read a cycle by an 8-row bf16 matmul over a large weight: the matrix
      unit's (MXU) weight stream, the fastest read of HBM that XLA:TPU's model prices; a call's
      "HBM bound" in cycles is its bytes over this.
    gemv: weight bytes read a cycle by the same matmul with one row, which XLA:TPU computes as
      an elementwise multiply and a reduction (its dot strength reduction).
  """

  stream: float
  matmul: float
  gemv: float


def _matmul(x, w):
  return x @ w


def reference_cycles(
  device: jax.Device, name: str, nbytes: int, *, options=None, cache_dir=None
) -> int:
  """Estimated cycles of a reference program over `nbytes` bytes of bf16 on `device`: 'stream'
  (`x * 2`, nbytes read and nbytes written), 'matmul' (an [8, 8192] x [8192, nbytes / 16384]
  matmul) or 'gemv' (its one-row form)."""
  on = jax.sharding.SingleDeviceSharding(device)
  arg = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=on)
  if name == 'stream':
    fn, args = _stream, (arg(nbytes // 2),)
  elif name in ('matmul', 'gemv'):
    columns, rem = divmod(nbytes, 2 * 8192)
    if rem or columns % 128:
      raise ValueError(f'A weight of {nbytes} bytes is not [8192, a multiple of 128] in bf16.')
    fn, args = _matmul, (arg(8 if name == 'matmul' else 1, 8192), arg(8192, columns))
  else:
    raise ValueError(f'Unknown reference program {name!r}: stream, matmul or gemv.')
  lowered = jax.jit(fn).lower(*args)
  compiled = compile_lowered(lowered, tag=device.device_kind, options=options, cache_dir=cache_dir)
  return compiled.program.cycles()


def calibrate(device: jax.Device, nbytes: int = 2**28, *, options=None, cache_dir=None):
  """`Calibration` of `device` from reference programs over `nbytes` bytes."""
  cycles = {
    name: reference_cycles(device, name, nbytes, options=options, cache_dir=cache_dir)
    for name in ('stream', 'matmul', 'gemv')
  }
  return Calibration(
    stream=2 * nbytes / cycles['stream'],
    matmul=nbytes / cycles['matmul'],
    gemv=nbytes / cycles['gemv'],
  )


def _stream(x):
  return x * 2
