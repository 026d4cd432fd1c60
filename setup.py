"""specdec_jax: lossless speculative decoding for T5 encoder-decoder pairs in JAX."""

import setuptools

setuptools.setup(
  name='specdec_jax',
  version='0.1.0',
  description='Speculative decoding (token and block verification) for T5 pairs in JAX/Flax.',
  packages=setuptools.find_packages(
    include=['specdec_jax', 'specdec_jax.*', 'experiments', 'experiments.*']
  ),
  package_data={'specdec_jax.data': ['*.md']},
  python_requires='>=3.11',
  install_requires=[
    # Tested: 0.10.2 (CPU, the suite) and 0.11.2 (an NVIDIA H200 with CUDA 13, docs/performance.md).
    'jax>=0.10.2,<0.12',
    'jaxlib>=0.10.2,<0.12',
    'flax==0.12.8',
    'optax==0.2.8',
    'orbax-checkpoint==0.12.8',
    'tensorstore',  # T5X checkpoints (zarr, OCDBT)
    'tqdm',
    'absl-py',
    'numpy',
    'ml_collections',
    'msgpack',
    'safetensors',
    'sentencepiece',
    'sacrebleu',
    'matplotlib',
  ],
  extras_require={
    # On an accelerator: pip install -e '.[cuda]' (NVIDIA, CUDA 13 wheels) or '.[tpu]' (a TPU VM).
    'cuda': ['jax[cuda13]>=0.10.2,<0.12'],
    'tpu': ['jax[tpu]>=0.10.2,<0.12'],
    'test': [
      # libtpu (XLA:TPU's compiler, Linux wheels only): tests/tpu_*_test.py compile every program
      # for TPU v4 devices on any Linux host (benchmarks.machines); skipped without it.
      "jax[tpu]>=0.10.2,<0.12; sys_platform == 'linux'",
      'pytest',
      'pytest-xdist',
      'scipy',
      'hypothesis',
      'ruff==0.14.0',
      # HF parity tests. torch==2.13.0 resolves to the CPU wheel in /opt/wheels here.
      'torch==2.13.0',
      'transformers==5.23.0',
      # tests/notebooks_test.py executes notebooks/*.ipynb in a python3 kernel.
      'nbclient',
      'nbformat',
      'ipykernel',
    ],
  },
)
