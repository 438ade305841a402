"""ElasticSampler refuses values that would make it loop or repeat (issue 39): a batch of no
samples (batch_size=0 yielded empty batches forever) and a negative position or epoch from a
state_dict (position=-7 silently repeated samples)."""
import pytest

pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

import edl.torch as et


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"batch_size": -1},
                                {"global_batch_size": 0}, {"global_batch_size": -3},
                                {"batch_size": 2.5}, {"global_batch_size": True}])
def test_non_positive_batch_sizes_are_refused(kw):
    name, value = next(iter(kw.items()))
    with pytest.raises(ValueError, match=rf"{name}={value!r}; give a positive integer"):
        et.ElasticSampler(10, **kw)


@pytest.mark.parametrize("d", [{"epoch": 0, "position": -7}, {"epoch": -1, "position": 0},
                               {"epoch": 0, "position": 1.5}])
def test_negative_positions_are_refused_and_the_state_kept(d):
    s = et.ElasticSampler(10, global_batch_size=4)
    s.load_state_dict({"epoch": 2, "position": 8})
    with pytest.raises(ValueError, match="give an integer >= 0"):
        s.load_state_dict(d)
    assert s.state_dict() == {"epoch": 2, "position": 8}


def test_good_values_still_load():
    s = et.ElasticSampler(10, global_batch_size=4, shuffle=False)
    s.load_state_dict({"epoch": 0, "position": 8})
    assert [b for b in s.batches(0)] == [[8, 9]]
