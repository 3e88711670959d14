"""Image samples decoded lazily per batch, and each dataset's train / test transforms.

Samples are file paths (decoded with PIL when a batch asks for them) or in-memory ``uint8``
arrays ``(H, W, 3)`` (CIFAR-100). Transforms follow the paper's supplementary "Details on
Datasets" and the reference code; the output side length is one setting,
the setting ``data.image_size`` (default 224, the ViT-B/16 input), so tests can use 16.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from common.run.settings import DataSettings

if TYPE_CHECKING:  # torchvision is imported on first use (see _transforms)
    from torchvision.transforms import InterpolationMode

IMAGE_SIZE = 224  # ViT-B/16 input side; the setting data.image_size overrides it
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # the in21k ViT's own normalisation
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

Transform = Callable[[Image.Image], Tensor]  # PIL RGB image -> (3, size, size) float32


@dataclass(frozen=True)
class ImageTransforms:
    train: Transform  # training augmentation (also used by the Gram pass)
    test: Transform  # deterministic evaluation transform


def image_size(data: DataSettings) -> int:
    """The input side in pixels: ``data.image_size``, or :data:`IMAGE_SIZE` when it is 0."""
    return data.image_size or IMAGE_SIZE


def _transforms() -> tuple[ModuleType, InterpolationMode]:
    """torchvision's ``transforms.v2`` and bicubic interpolation, imported on first use: importing
    torchvision pulls in ``torch._dynamo`` (about 2 s per process), which a text run never needs."""
    from torchvision.transforms import InterpolationMode, v2

    return v2, InterpolationMode.BICUBIC


def _finish(norm: tuple | None) -> list:
    """PIL -> float32 in [0, 1], then the dataset's normalisation (none: the identity)."""
    v2, _ = _transforms()
    steps = [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)]
    return steps + [v2.Normalize(*norm)] if norm else steps


def _eval(size: int, norm: tuple | None) -> Transform:
    """Resize the short side to 256/224 of the output, bicubic, then a centre crop."""
    v2, BICUBIC = _transforms()
    return v2.Compose([v2.Resize(round(size * 256 / 224), interpolation=BICUBIC), v2.CenterCrop(size), *_finish(norm)])


def _square(size: int, norm: tuple | None, flip: bool) -> Transform:
    """Resize to ``size x size`` (no crop), optionally flip; Cars-196 and EuroSAT."""
    v2, BICUBIC = _transforms()
    flips = [v2.RandomHorizontalFlip()] if flip else []
    return v2.Compose([v2.Resize((size, size), interpolation=BICUBIC), *flips, *_finish(norm)])


def image_transforms(name: str, size: int) -> ImageTransforms:
    """The train and test transforms of dataset ``name`` at output side ``size``.

    CIFAR-100, ImageNet-R (and bring-your-own images by default): RandomResizedCrop (bicubic)
    + flip, Normalize(0.5, 0.5); test: Resize 256 + CenterCrop 224, same normalisation.
    ImageNet-A: RandomResizedCrop scale (0.05, 1), ratio (3/4, 4/3) + flip, ImageNet mean/std.
    CUB-200: Resize 256 + RandomCrop 224 + flip, ImageNet mean/std. Cars-196: flip, mean 0 /
    std 1 (the identity). EuroSAT: no augmentation, no normalisation. Every pipeline first
    brings images to ``size x size``, since the ViT needs a fixed input size.
    """
    v2, BICUBIC = _transforms()
    resize = round(size * 256 / 224)
    flip = v2.RandomHorizontalFlip()
    if name in ("cifar100", "imagenet-r", "imagefolder"):
        train = v2.Compose([v2.RandomResizedCrop(size, interpolation=BICUBIC), flip, *_finish(HALF)])
        return ImageTransforms(train, _eval(size, HALF))
    if name == "imagenet-a":
        train = v2.Compose(
            [
                v2.RandomResizedCrop(size, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3), interpolation=BICUBIC),
                flip,
                *_finish(IMAGENET),
            ]
        )
        return ImageTransforms(train, _eval(size, IMAGENET))
    if name == "cub200":
        train = v2.Compose([v2.Resize(resize, interpolation=BICUBIC), v2.RandomCrop(size), flip, *_finish(IMAGENET)])
        return ImageTransforms(train, _eval(size, IMAGENET))
    if name == "cars196":
        return ImageTransforms(_square(size, None, flip=True), _square(size, None, flip=False))
    if name == "eurosat":
        same = _square(size, None, flip=False)
        return ImageTransforms(same, same)
    raise ValueError(
        f"no image transforms for {name!r}; known: cifar100, imagenet-r, imagenet-a, cub200, "
        "cars196, eurosat, imagefolder"
    )


def is_image_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def open_rgb(sample: str | Path | np.ndarray) -> Image.Image:
    """A sample as a PIL RGB image: decode a file, or wrap a ``uint8 (H, W, 3)`` array."""
    if isinstance(sample, np.ndarray):
        return Image.fromarray(sample).convert("RGB")
    with Image.open(sample) as image:
        return image.convert("RGB")  # grey-scale and palette images too (Cars-196, CUB-200)


class ImageData:
    """Image samples and labels ``(n,)``; ``batch`` decodes and transforms only the asked samples.

    With ``train=True`` the augmentation draws its randomness from ``generator`` alone: one
    seed is drawn from it per batch and the (torch-RNG based) transforms run under that seed in
    a forked RNG, so the same generator state gives identical tensors and the global RNG is left
    untouched.
    """

    def __init__(
        self,
        samples: Sequence[str | Path | np.ndarray],
        labels: Tensor | np.ndarray,
        train_transform: Transform,
        test_transform: Transform,
    ) -> None:
        self.samples = list(samples)
        self.labels = torch.as_tensor(labels, dtype=torch.int64)
        if len(self.samples) != self.labels.shape[0]:
            raise ValueError(f"{len(self.samples)} images but {self.labels.shape[0]} labels")
        self.train_transform, self.test_transform = train_transform, test_transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def _pixels(self, idx: list[int], transform: Transform) -> Tensor:
        return torch.stack([transform(open_rgb(self.samples[i])) for i in idx])  # (batch, 3, H, W)

    def batch(
        self,
        idx: Tensor,
        device: torch.device,
        *,
        train: bool = False,
        generator: torch.Generator | None = None,
        padded: bool = False,
    ) -> tuple[dict[str, Tensor], Tensor]:
        rows = [int(i) for i in idx]
        if not train:
            pixels = self._pixels(rows, self.test_transform)
        elif generator is None:
            pixels = self._pixels(rows, self.train_transform)  # torch's global RNG: not reproducible
        else:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                pixels = self._pixels(rows, self.train_transform)
        return {"pixel_values": pixels.to(device)}, self.labels[idx].to(device)
