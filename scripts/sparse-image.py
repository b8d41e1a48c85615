#!/usr/bin/env python3
"""A device image as the 4 KiB pages that are not all zero, so a cache
image made by an old release can be kept in the tests (tests/fixtures/).

    scripts/sparse-image.py encode IMAGE OUT.sparse
    scripts/sparse-image.py decode IN.sparse IMAGE

Format (little-endian): b"TCSPARSE1\\n", the image's size (u64), the page
size (u32, 4096), then for each non-zero page its index (u64) and its
4096 bytes, in ascending order. tests/common/sparse.rs reads it.
"""
import struct
import sys

MAGIC = b"TCSPARSE1\n"
PAGE = 4096


def encode(src, dst):
    with open(src, "rb") as f:
        data = f.read()
    if len(data) % 512:
        sys.exit(f"{src}: {len(data)} bytes is not whole sectors")
    with open(dst, "wb") as out:
        out.write(MAGIC + struct.pack("<QI", len(data), PAGE))
        for i in range(0, len(data), PAGE):
            page = data[i:i + PAGE]
            if page.count(0) != len(page):
                out.write(struct.pack("<Q", i // PAGE) + page.ljust(PAGE, b"\0"))


def decode(src, dst):
    with open(src, "rb") as f:
        blob = f.read()
    if not blob.startswith(MAGIC):
        sys.exit(f"{src}: not a sparse image")
    size, page = struct.unpack_from("<QI", blob, len(MAGIC))
    image = bytearray(size)
    at = len(MAGIC) + 12
    while at < len(blob):
        (index,) = struct.unpack_from("<Q", blob, at)
        start = index * page
        chunk = blob[at + 8:at + 8 + page][:max(0, size - start)]
        image[start:start + len(chunk)] = chunk
        at += 8 + page
    with open(dst, "wb") as f:
        f.write(image)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("encode", "decode"):
        sys.exit(__doc__)
    (encode if sys.argv[1] == "encode" else decode)(sys.argv[2], sys.argv[3])
