"""debsumm drafter: the EN->DE drafter's shape (1.14M params) on description -> synopsis.

  python -m scripts.train --config=experiments/configs/train_summ_drafter.py \\
      --workdir=workdir/summ_drafter
  python -m scripts.train --config=experiments/configs/train_summ_drafter.py:runlocal \\
      --workdir=/tmp/summ_drafter_smoke

Data, lengths and tokenizer as `train_summ_target.py` (build the corpus and tokenizer first).
"""

import ml_collections

from experiments.configs import common, train_common, train_drafter, train_summ_target


def get_config(arg: str | None = None):
  c = train_common.base_config()
  c.model = ml_collections.ConfigDict(train_drafter.get_config().model.to_dict())
  train_summ_target.summ_settings(c)

  def runlocal(c):
    train_summ_target.summ_runlocal(c)
    c.model.update(d_model=16, d_kv=4, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)

  return common.parse(arg, c, {'runlocal': runlocal})
