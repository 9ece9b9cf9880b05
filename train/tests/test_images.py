import io

import numpy as np
import pytest
from PIL import Image

from jointspace_train.vision import images


def test_resize_keeps_constants_and_identity():
    rgb = np.full((37, 53, 3), 77, np.uint8)
    out = images.resize(rgb, 256)
    assert out.shape == (256, 256, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, 77, atol=1e-4)
    rnd = np.random.default_rng(0).integers(0, 256, (256, 256, 3)).astype(np.uint8)
    np.testing.assert_allclose(images.resize(rnd, 256), rnd, atol=1e-4)


def test_resize_upscale_is_linear_interpolation():
    # 2 -> 4 along each axis: centres at 0.25, 0.75... weights follow the triangle filter
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[:, 1] = 100
    row = images.resize(rgb, 4)[0, :, 0]
    np.testing.assert_allclose(row, [0, 25, 75, 100], atol=1e-4)


def test_ten_crops_order_and_mirrors():
    img = np.random.default_rng(1).random((256, 256, 3)).astype(np.float32)
    c = images.crops(img, 224, "ten")
    assert c.shape == (10, 224, 224, 3)
    np.testing.assert_array_equal(c[0], img[:224, :224])
    np.testing.assert_array_equal(c[1], img[:224, 32:])
    np.testing.assert_array_equal(c[3], img[32:, 32:])
    np.testing.assert_array_equal(c[4], img[16:240, 16:240])
    np.testing.assert_array_equal(c[5], img[:224, :224][:, ::-1])
    np.testing.assert_array_equal(images.crops(img, 224, "center")[0], c[4])
    with pytest.raises(ValueError):
        images.crops(img, 224, "five")
    w = images.crops(img, 224, "windowed")
    assert w.shape == (2, 256, 256, 3)
    np.testing.assert_array_equal(w[0], img)
    np.testing.assert_array_equal(w[1], img[:, ::-1])


def test_normalise_orders_channels_and_subtracts_mean():
    px = np.zeros((1, 2, 2, 3), np.float32)
    px[..., 0], px[..., 2] = 200, 10  # R, B
    x = images.normalise(px, "BGR", [100, 0, 0], [1, 1, 0.5])
    assert x.shape == (1, 3, 2, 2)
    assert x[0, 0, 0, 0] == 10 - 100 and x[0, 2, 0, 0] == 200 * 0.5


def test_decode_handles_modes():
    buf = io.BytesIO()
    Image.new("LA", (5, 4), (120, 7)).save(buf, "PNG")
    rgb = images.decode(buf.getvalue())
    assert rgb.shape == (4, 5, 3) and (rgb == 120).all()


def test_prepare_squashes_other_sizes_with_pils_bilinear_and_leaves_the_prepared_size_alone():
    spec = {"resize": [224, 224], "filter": "bilinear"}
    rng = np.random.default_rng(3)
    same = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    assert images.prepare(same, spec) is same
    assert images.prepare(same, None) is same
    big = rng.integers(0, 256, (300, 451, 3), dtype=np.uint8)
    out = images.prepare(big, spec)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    want = np.asarray(Image.fromarray(big).resize((224, 224), Image.Resampling.BILINEAR))
    assert np.array_equal(out, want)
    # preprocess applies it before the resize to 256: a 448x448 photo and its PIL squash give the same crops.
    vision = {"resize": 256, "input_size": 224, "crop_mode": "center", "color_order": "RGB",
              "mean": [0, 0, 0], "scale": [1, 1, 1], "prepare": spec}
    photo = rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)

    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        return buf.getvalue()

    squashed = np.asarray(Image.fromarray(photo).resize((224, 224), Image.Resampling.BILINEAR))
    assert np.array_equal(images.preprocess(png(photo), vision), images.preprocess(png(squashed), vision))
    assert not np.array_equal(images.preprocess(png(photo), {**vision, "prepare": None}),
                              images.preprocess(png(squashed), vision))
