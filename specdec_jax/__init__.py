"""specdec_jax: lossless speculative decoding of T5 encoder-decoder pairs in JAX.

Modules: `sampling` (standardized sampling), `verify` (token and block verification),
`analysis` (the paper's formulas), `models.t5` + `cache` (T5 with multi-token incremental
decoding), `checkpoints` (HF / T5X / orbax), `decode` (the jitted loops), `drafters`.
"""
