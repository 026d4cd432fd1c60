"""Fixtures shared by the tests; the plain functions behind them are in tests/helpers.py."""

import pytest

from specdec_jax import pretrained
from tests import helpers


@pytest.fixture(scope='session')
def ende_pair() -> pretrained.Pair:
  """The shipped `pretrained/ende` pair, loaded once per session (tests only read it); skips the
  test where this checkout does not ship it."""
  if not helpers.shipped('ende'):
    pytest.skip('pretrained/ende not shipped')
  return pretrained.load('ende')


@pytest.fixture(scope='session')
def tiny_pair():
  """(target, drafter): random tiny-v1.1 (seed 0) and tiny-v1.0 (seed 1), one vocabulary."""
  return helpers.tiny_t5('tiny-v1.1', seed=0), helpers.tiny_t5('tiny-v1.0', seed=1)
