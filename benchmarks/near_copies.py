"""How the near-copy detector (dpsad.data.near_copies) chose its threshold: on the bundled public glyphs only.

For each threshold it prints the false-positive rate (the share of distinct rendered glyphs that lie near another
one) and the detection rate of four kinds of near-copy made from the same glyphs: shifted by one pixel (right, and
right and up), re-encoded as JPEG at quality 95, and one pixel changed by one.  (A turned copy is found by the
exact digests as read.)  Reads no private record.

    PYTHONPATH=src .venv/bin/python benchmarks/near_copies.py [--per-class 200] [--letters]
"""

from __future__ import annotations

import argparse
import io
import time

import numpy as np
from PIL import Image

from dpsad.data.font_glyphs import render_font_digits, render_font_glyphs
from dpsad.data.near_copies import HASH_SIZE, MEAN_TOLERANCE, THRESHOLD, WORDS, perceptual_hashes


def variants(images: np.ndarray) -> dict[str, np.ndarray]:
    jpeg = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0]).save(buffer, format="JPEG", quality=95)
        jpeg.append(np.asarray(Image.open(buffer))[..., None])
    pixel = images.copy()
    middle = images.shape[1] // 2
    pixel[:, middle, middle, 0] = np.where(pixel[:, middle, middle, 0] < 255, pixel[:, middle, middle, 0] + 1, 254)
    return {"shift 1 px": np.roll(images, 1, axis=2), "shift diagonal": np.roll(images, (1, -1), axis=(2, 1)),
            "jpeg 95": np.stack(jpeg), "one pixel +1": pixel}


def distances(hashes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Bits between each row of ``hashes`` and each row of ``others``, [N, M]; pairs whose mean grey levels differ
    by more than dpsad.data.near_copies.MEAN_TOLERANCE get all 256 (never near)."""
    bits = np.concatenate([np.bitwise_count(hashes[i:i + 256, None, :WORDS] ^ others[None, :, :WORDS]).sum(axis=2)
                           for i in range(0, len(hashes), 256)])
    apart = np.abs(hashes[:, None, WORDS].astype(np.int64) - others[None, :, WORDS].astype(np.int64))
    return np.where(apart <= 16 * MEAN_TOLERANCE, bits, HASH_SIZE * HASH_SIZE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--letters", action="store_true", help="the bundled public letters a to j instead of digits")
    args = parser.parse_args()
    images = (render_font_glyphs("abcdefghij", args.per_class, 0) if args.letters
              else render_font_digits(args.per_class, 0))[0][..., None]
    start = time.perf_counter()
    hashes = perceptual_hashes(images)
    seconds = time.perf_counter() - start
    copies = {name: perceptual_hashes(v) for name, v in variants(images).items()}
    distance = distances(hashes, hashes)
    np.fill_diagonal(distance, HASH_SIZE * HASH_SIZE)
    nearest = distance.min(axis=1)
    copy_distance = {name: np.diagonal(distances(c, hashes)) for name, c in copies.items()}
    print(f"{len(images)} public {'letters' if args.letters else 'digits'}, 28 x 28; {seconds / len(images) * 1e3:.2f} ms an image to hash; "
          f"{HASH_SIZE * HASH_SIZE}-bit hashes")
    print("threshold | false positives | " + " | ".join(copies))
    for threshold in (0, 4, 8, 12, 16, 24, 32, 40, 48, 56):
        found = [np.mean(copy_distance[name] <= threshold) for name in copies]
        mark = "  <- dpsad.data.near_copies.THRESHOLD" if threshold == THRESHOLD else ""
        print(f"{threshold} | {np.mean(nearest <= threshold):.4f} | " + " | ".join(f"{f:.4f}" for f in found) + mark)


if __name__ == "__main__":
    main()
