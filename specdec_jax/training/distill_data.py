"""The distillation data (`specdec_jax.training.distill`): what the target says about the training sources.

- `generate_outputs`: the target's own outputs (greedy or sampled) on the sources, the sequences a
  drafter is trained on, generated once in resumable shards.
- `TeacherStates`: the target's teacher-forced encoder output and final decoder states on those
  sequences, computed once, so that a distillation step runs only the target's output layer.

Each shard records a fingerprint of what it was computed from (the target's params, the shard's
sources, the settings); a rerun reuses a shard only if it matches and raises otherwise, so a
workdir pointed at another target or source file never serves stale data.

With a `mesh` (the target placed on it) each batch is split over its 'data' axis, every process
runs the sharded computation, the results are gathered to every process (each needs any pair's
rows later: the batch order is global), and process 0 alone writes the shard files.

Axis legend: B batch, S source length, T target length, D model dim.
"""

import dataclasses
import functools
import hashlib
import os

import jax
import numpy as np

from specdec_jax import decode, sharding
from specdec_jax import sampling as sampling_lib
from specdec_jax.data import batching
from specdec_jax.models import t5


def _digest(*parts) -> str:
  """sha1 of arrays (their bytes, dtype and shape) and of anything else by its repr."""
  h = hashlib.sha1()
  for part in parts:
    if isinstance(part, (np.ndarray, jax.Array)):
      part = np.ascontiguousarray(part)
      h.update(f'{part.dtype}{part.shape}'.encode())
      h.update(part.tobytes())
    else:
      h.update(repr(part).encode())
  return h.hexdigest()


def config_key(config: t5.T5Config) -> tuple:
  """The fields of `config` that differ from their defaults, (name, value) in field order: a
  field added to `T5Config` later, at its default, leaves every fingerprint (and so every cached
  shard) as it was."""
  fields = dataclasses.fields(config)
  return tuple(
    (f.name, getattr(config, f.name)) for f in fields if getattr(config, f.name) != f.default
  )


def model_digest(model: t5.T5Model) -> str:
  """A fingerprint of a model: its config (`config_key`) and every parameter's bytes (each
  gathered to the host in turn: a sharded 11B target never sits whole in host memory)."""
  params = [_digest(decode.to_host(x)) for x in jax.tree.leaves(model.params)]
  return _digest(config_key(model.config), *params)


def _load_shard(path: str, digest: str) -> dict | None:
  """The arrays of the shard at `path` if it exists; raises if it was made from other inputs."""
  sharding.barrier(f'shard {path}')  # every process sees the same files
  if not os.path.exists(path):
    return None
  with np.load(path) as f:
    arrays = dict(f)
  if str(arrays.pop('digest', '')) != digest:
    raise ValueError(
      f'{path} was computed from other sources, another target or other settings than this '
      "run's; point the run at a new workdir (or delete that directory) to compute it afresh."
    )
  return arrays


def _save_shard(path: str, digest: str, **arrays) -> None:
  """Writes the shard (process 0; whole or not at all)."""
  if sharding.is_main_process():
    np.savez(path + '.tmp.npz', digest=np.array(digest), **arrays)
    os.replace(path + '.tmp.npz', path)


def _on(mesh, *arrays):
  """Host arrays (the same on every process) split over `mesh`'s 'data' axis, or as they are."""
  return arrays if mesh is None else sharding.from_host(arrays, mesh)


def generate_outputs(
  teacher: t5.T5Model,
  data: batching.EncodedPairs,
  *,
  temperature: float,
  batch_size: int,
  max_new_tokens: int,
  shard_dir: str,
  seed: int = 0,
  shard_size: int = 4096,
  width_step: int = 32,
  progress: bool = True,
  mesh=None,
) -> batching.EncodedPairs:
  """The target's outputs on `data`'s sources, as new pairs (source, output); `mesh`: see the
  module docstring (`batch_size` must split over its 'data' axis).

  Generated in shards of `shard_size` sources saved to `shard_dir` (`shard_00000.npz`, ...); a
  rerun reuses the shards already written, so an interrupted generation resumes. Sources are
  decoded in order of length, so a batch's rows finish together and its source columns are cut
  to its longest source (rounded up to `width_step`): long-tailed sources such as debsumm's
  (median 87, up to 256 tokens) cost their own length, not the widest one's.
  """
  if sharding.is_main_process():
    os.makedirs(shard_dir, exist_ok=True)
  sampling = sampling_lib.SamplingConfig(temperature=temperature)
  outputs = np.zeros((len(data), max_new_tokens), np.int32)
  lengths = np.zeros(len(data), np.int32)
  order = np.argsort(data.input_lengths, kind='stable')
  shards = range(0, len(data), shard_size)
  bar = progress_bar(len(data), f'target outputs at temperature {temperature:g}', progress)
  teacher_digest = model_digest(teacher)
  for shard, start in enumerate(shards):
    path = os.path.join(shard_dir, f'shard_{shard:05d}.npz')
    index = order[start : start + shard_size]
    digest = _digest(
      teacher_digest, data.inputs[index], data.input_lengths[index], temperature, max_new_tokens
    )
    if (found := _load_shard(path, digest)) is not None:
      tokens, n = found['tokens'], found['lengths']
    else:
      tokens, n = [], []
      for b in range(0, len(index), batch_size):
        rows = index[b : b + batch_size]
        pad = np.concatenate([rows, np.full(batch_size - len(rows), rows[0])])
        # Sorted by length, a batch's sources fit in fewer columns than the widest: cut to the
        # next multiple of `width_step` (a compiled decode per width, not per batch).
        width = -(-int(data.input_lengths[pad].max()) // width_step) * width_step
        ids = data.inputs[pad, : min(width, data.inputs.shape[1])]
        mask = np.arange(ids.shape[1]) < data.input_lengths[pad, None]
        out = decode.generate(
          teacher,
          *_on(mesh, ids, mask.astype(np.int32)),
          sampling=sampling,
          max_new_tokens=max_new_tokens,
          rng=jax.random.key(hash((seed, shard, b)) % 2**31),
        )
        out = decode.to_host(out)
        tokens.append(out.tokens[: len(rows)])
        n.append(out.lengths[: len(rows)])
        bar.update(len(rows))
      tokens, n = np.concatenate(tokens), np.concatenate(n)
      _save_shard(path, digest, tokens=tokens, lengths=n)
    if bar.n < start + len(index):
      bar.update(start + len(index) - bar.n)
    outputs[index], lengths[index] = tokens, n
  bar.close()
  keep = lengths > 0
  return batching.EncodedPairs(
    data.inputs[keep], outputs[keep], data.input_lengths[keep], lengths[keep]
  )


@functools.partial(jax.jit, static_argnames=('config', 'with_encoder', 'layers'))
def _teacher_states(params, batch, *, config: t5.T5Config, with_encoder: bool, layers=None):
  encoded = t5.encode(params, batch['inputs'], batch['input_mask'], config=config)
  decoder_in = t5.shift_right(batch['targets'], config.decoder_start_token_id)
  out = t5.decoder_states(
    params, encoded, batch['input_mask'], decoder_in, config=config, state_layers=layers
  )
  states, tapped = out if layers is not None else (out, None)
  return (encoded if with_encoder else None), states, tapped


@dataclasses.dataclass
class TeacherStates:
  """The target's teacher-forced computation on every training pair, done once: its final decoder
  states (and, for a student over its encoder, its encoder output; for a student reading several
  of its layers, `T5Config.feature_layers`, those layers' states), one float32 array per pair,
  cut to the pair's real tokens. A distillation step then pays only the target's output layer
  (`t5.output_logits`), and the loss is exactly that of the live target.

  Memory: 4 bytes x d_model x (target tokens x (1 + feature layers) + source tokens if with the
  encoder).
  """

  decoder: list[np.ndarray]  # [T_i, D] per pair
  encoder: list[np.ndarray] | None  # [S_i, D] per pair, or None
  features: list[np.ndarray] | None = None  # [T_i, len(feature_layers) x D] per pair, or None

  @classmethod
  def compute(
    cls,
    teacher: t5.T5Model,
    data: batching.EncodedPairs,
    *,
    with_encoder: bool,
    batch_size: int,
    buckets,
    shard_dir: str,
    feature_layers: tuple[int, ...] | None = None,
    shard_size: int = 4096,
    progress: bool = True,
    mesh=None,
  ) -> 'TeacherStates':
    """Runs the target over `data` in batches of similar length (one compiled shape per bucket of
    `buckets`), in shards saved to `shard_dir` so that an interrupted run resumes; `mesh`: see
    the module docstring."""
    if sharding.is_main_process():
      os.makedirs(shard_dir, exist_ok=True)
    pair_length = np.maximum(data.input_lengths, data.target_lengths)
    order = np.argsort(pair_length, kind='stable')
    decoder, encoder = [None] * len(data), ([None] * len(data) if with_encoder else None)
    features = None if feature_layers is None else [None] * len(data)
    layers = () if feature_layers is None else (tuple(feature_layers),)  # old shards stay valid
    bar = progress_bar(len(data), "target's states for the training pairs", progress)
    teacher_digest = model_digest(teacher)
    for shard, start in enumerate(range(0, len(data), shard_size)):
      path = os.path.join(shard_dir, f'shard_{shard:05d}.npz')
      index = order[start : start + shard_size]
      digest = _digest(
        teacher_digest,
        with_encoder,
        *layers,
        *(getattr(data, f.name)[index] for f in dataclasses.fields(data)),
      )
      arrays = _load_shard(path, digest)
      if arrays is None:
        arrays = {}
        for b in range(0, len(index), batch_size):
          rows = index[b : b + batch_size]
          pad = np.concatenate([rows, np.full(batch_size - len(rows), rows[-1])])
          length = buckets[np.searchsorted(buckets, pair_length[rows].max())]
          cut = (min(length, data.inputs.shape[1]), min(length, data.targets.shape[1]))
          batch = batching.batch_arrays(data, pad, *cut)
          if mesh is not None:
            batch = sharding.from_host(batch, mesh)
          enc, dec, feat = decode.to_host(
            _teacher_states(
              teacher.params, batch, config=teacher.config, with_encoder=with_encoder,
              layers=feature_layers,
            )
          )  # fmt: skip
          for r, i in enumerate(rows):
            arrays[f'd{i}'] = dec[r, : data.target_lengths[i]]
            if enc is not None:
              arrays[f'e{i}'] = enc[r, : data.input_lengths[i]]
            if feat is not None:
              arrays[f'f{i}'] = feat[r, : data.target_lengths[i]]
          bar.update(len(rows))
        _save_shard(path, digest, **arrays)
      for i in index:
        decoder[i] = arrays[f'd{i}']
        if with_encoder:
          encoder[i] = arrays[f'e{i}']
        if features is not None:
          features[i] = arrays[f'f{i}']
      if bar.n < start + len(index):
        bar.update(start + len(index) - bar.n)
    bar.close()
    return cls(decoder, encoder, features)

  def fields(self, index: np.ndarray, source_length: int, target_length: int) -> dict:
    """The batch fields `_logits` reads for rows `index`: 'teacher_states' f32[B, T, D], with
    the encoder 'encoded' f32[B, S, D], and with feature layers 'teacher_features'
    f32[B, T, F], zero past each pair's real tokens (masked anyway)."""

    def stack(arrays, length):
      out = np.zeros((len(index), length, arrays[index[0]].shape[-1]), np.float32)
      for r, i in enumerate(index):
        out[r, : len(arrays[i])] = arrays[i][:length]
      return out

    fields = {'teacher_states': stack(self.decoder, target_length)}
    if self.encoder is not None:
      fields['encoded'] = stack(self.encoder, source_length)
    if self.features is not None:
      fields['teacher_features'] = stack(self.features, target_length)
    return fields


def progress_bar(total: int, description: str, enabled: bool):
  from tqdm.auto import tqdm  # a dependency of transformers/orbax; imported here only

  return tqdm(
    total=total,
    desc=description,
    disable=not enabled or not sharding.is_main_process(),
    dynamic_ncols=True,
    mininterval=5.0,
  )
