import numpy as np
import pytest

from jointspace_train.vision import fne


def test_thresholds_are_strict():
    z = np.array([-1.0, -0.2500001, -0.25, -0.1, 0.0, 0.15, 0.1500001, 3.0], np.float32)
    assert fne.ternary(z).tolist() == [-1, -1, 0, 0, 0, 0, 1, 1]


def test_zscore_uses_train_stats_and_zero_std_scores_zero():
    train = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0]], np.float32)
    mean, std = fne.stats(train)
    assert mean.tolist() == [2.0, 5.0, 3.0] and std.tolist() == [1.0, 0.0, 1.0]
    z = fne.zscore(np.array([[4.0, 9.0, 2.9]], np.float32), mean, std)
    assert z[0, 1] == 0.0  # constant feature: no information, whatever the value
    np.testing.assert_allclose(z[0], [2.0, 0.0, -0.1], rtol=1e-6)
    assert fne.encode(np.array([[4.0, 9.0, 2.9]]), mean, std).tolist() == [[1, 0, 0]]


def test_pack_layout_and_round_trip():
    codes = np.array([[1, -1, 0, 0, 0, 0, 0, 0, 1, -1]], np.int8)
    packed = fne.pack(codes)
    # two planes of ceil(10/8) = 2 bytes; feature j is bit j%8 of byte j/8, LSB first
    assert packed.tolist() == [[0b00000001, 0b00000001, 0b00000010, 0b00000010]]
    rng = np.random.default_rng(0)
    many = rng.integers(-1, 2, (5, 4224)).astype(np.int8)
    assert np.array_equal(fne.unpack(fne.pack(many), 4224), many)
    assert fne.pack(many).shape == (5, 1056)


def test_unpack_rejects_invalid_codes():
    with pytest.raises(ValueError, match="both"):
        fne.unpack(np.array([1, 1], np.uint8), 8)
    with pytest.raises(ValueError, match="bytes"):
        fne.unpack(np.array([1, 0, 0], np.uint8), 8)
