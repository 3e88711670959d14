"""The server's image inputs: decoded per request, so that a bad one fails its own request, not a batch."""

from __future__ import annotations

import base64
import io

import pytest
from fastapi import HTTPException
from PIL import Image

from serve.app import _decode


def png(color: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (5, 4), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_base64_images_become_rgb_images():
    images = _decode([png((255, 0, 0)), png((0, 0, 255))])
    assert [im.size for im in images] == [(5, 4), (5, 4)] and images[1].getpixel((0, 0)) == (0, 0, 255)


@pytest.mark.parametrize("bad", ["not base64!", base64.b64encode(b"not an image").decode()])
def test_a_bad_image_is_refused_with_its_place(bad):
    with pytest.raises(HTTPException) as refused:
        _decode([png((1, 2, 3)), bad])
    assert refused.value.status_code == 422 and "image 1" in refused.value.detail
