"""Drafter: same vocabulary (8000), gated-GELU, tied embeddings, 2 encoder + 1 decoder layers.

  python -m scripts.train --config=experiments/configs/train_drafter.py --workdir=workdir/drafter
  python -m scripts.train --config=experiments/configs/train_drafter.py:runlocal \\
      --workdir=/tmp/drafter_smoke

1,137,760 params: 11.9x fewer than the target of `train_target.py` (13,539,072), most of them
in the 8000 x 96 embedding.
"""

from experiments.configs import common, train_common


def get_config(arg: str | None = None):
  c = train_common.base_config()
  c.model = dict(
    vocab_size=8000,
    d_model=96,
    d_kv=24,
    num_heads=4,
    d_ff=256,
    num_encoder_layers=2,
    num_decoder_layers=1,
    feed_forward='gated-gelu',
    tie_word_embeddings=True,
  )

  def runlocal(c):
    train_common.shrink(c)
    c.model.update(d_model=16, d_kv=4, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)

  return common.parse(arg, c, {'runlocal': runlocal})
