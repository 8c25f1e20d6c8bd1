#!/usr/bin/env python3
"""Counts the pixels of given colours in a PNG, for tests/unit/test_report.cpp.

    png_colours.py FILE.png TOLERANCE '#rrggbb'...

prints one JSON object, {"width": W, "height": H, "counts": {"#rrggbb": N, ...}}: N is the
number of pixels whose red, green and blue each lie within TOLERANCE of the colour's. Reads
8-bit RGB and RGBA PNGs without interlacing (what Chromium's screenshots are), with the
standard library alone (zlib, struct). Exit status 2 for a file it cannot read.
"""
import json
import struct
import sys
import zlib


def fail(message):
    print(f"png_colours: {message}", file=sys.stderr)
    sys.exit(2)


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def unfilter(kind, line, prev, bpp):
    """One scanline's bytes without its filter (PNG specification, section 9)."""
    n = len(line)
    if kind == 0:
        return line
    if kind == 2:  # up
        return bytearray((x + y) & 255 for x, y in zip(line, prev))
    out = bytearray(line)
    for i in range(n):
        a = out[i - bpp] if i >= bpp else 0
        if kind == 1:  # sub
            out[i] = (out[i] + a) & 255
        elif kind == 3:  # average
            out[i] = (out[i] + ((a + prev[i]) >> 1)) & 255
        elif kind == 4:  # paeth
            c = prev[i - bpp] if i >= bpp else 0
            out[i] = (out[i] + paeth(a, prev[i], c)) & 255
        else:
            fail(f"unknown filter type {kind}")
    return out


def read_png(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, header = 8, [], None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        fail(f"{path} has no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        fail(f"{path}: bit depth {depth}, colour type {colour}, interlace {interlace}; "
             "only 8-bit RGB or RGBA without interlacing is read")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    if len(raw) != height * (stride + 1):
        fail(f"{path}: {len(raw)} bytes of image data, expected {height * (stride + 1)}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = unfilter(raw[start], bytearray(raw[start + 1:start + 1 + stride]), prev, bpp)
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def main():
    if len(sys.argv) < 4:
        fail("usage: png_colours.py FILE.png TOLERANCE '#rrggbb'...")
    width, height, bpp, rows = read_png(sys.argv[1])
    tolerance = int(sys.argv[2])
    colours = {}
    for c in sys.argv[3:]:
        if len(c) != 7 or c[0] != "#":
            fail(f"'{c}' is not a colour #rrggbb")
        colours[c] = tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))
    # Distinct pixels first: a screenshot has few colours and many pixels.
    histogram = {}
    for row in rows:
        for x in range(0, len(row), bpp):
            px = row[x:x + 3]
            histogram[px] = histogram.get(px, 0) + 1
    counts = {c: 0 for c in colours}
    for px, n in histogram.items():
        for c, (r, g, b) in colours.items():
            if abs(px[0] - r) <= tolerance and abs(px[1] - g) <= tolerance and \
                    abs(px[2] - b) <= tolerance:
                counts[c] += n
    print(json.dumps({"width": width, "height": height, "counts": counts}))


if __name__ == "__main__":
    main()
