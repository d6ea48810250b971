"""The catalogued pretrained model the ``realmodel`` tests run on (``bench fetch-model`` gets it once)."""

import pytest

REAL_MODEL = "smollm2-135m-instruct"


def real_model_param():
    """:data:`REAL_MODEL` as a ``family`` parameter of the runtime's invariant tests, marked ``realmodel``."""
    return pytest.param(REAL_MODEL, marks=pytest.mark.realmodel)
