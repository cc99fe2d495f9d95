import pytest
from pp_configs import shape_of as _shape_of


@pytest.fixture
def shape_of():
    return _shape_of
