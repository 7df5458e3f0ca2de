"""What the top-k's passes share: an order-preserving sort key of a logit and its bucket.

`sort_key` maps fp32 to uint32 with the same order. `bucket` maps the sort key to 0-255, non-decreasing: its sign,
then half-binades of the magnitude (8 exponent bits and 1 mantissa bit) from 2^-32 to 2^32, the magnitudes outside
clamped into the end buckets. A bucket is a fixed ratio of the value wide (x1.5 or x1.33), whatever the logits'
scale, so the bucket holding a row's k-th largest logit holds few keys (about 2% of a row of normal logits at the top
1%); where logits fall outside the window or crowd one bucket, the top-k's candidate buffer overflows and its exact
fallback runs (topk.py).
"""

import triton
import triton.language as tl

BINS = tl.constexpr(256)
# The buckets' window: sign, 8 exponent bits and 1 mantissa bit of the magnitude (sort_key >> 22, 10 bits), with
# 128 buckets a sign covering 2^-32 .. 2^32.
_WINDOW_LO = tl.constexpr(2 * (127 - 32))


@triton.jit
def sort_key(logits):
    """fp32 -> uint32 with the same order (negative values flipped, the sign bit set on the others)."""
    bits = logits.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, ~bits, bits | 0x80000000)


@triton.jit
def bucket(key):
    """A sort key's bucket, 0-255, non-decreasing in the key: 128-255 the positive half-binades 2^-32 .. 2^32 (the
    rest of the positives clamped into the end ones), 0-127 the negative ones mirrored (-inf in 0)."""
    t = (key >> 22).to(tl.int32)  # sign, exponent, one mantissa bit
    pos = tl.minimum(tl.maximum(t - 512 - _WINDOW_LO, 0), 127)
    neg = tl.minimum(tl.maximum(511 - t - _WINDOW_LO, 0), 127)
    return tl.where(t >= 512, 128 + pos, 127 - neg)


@triton.jit
def bucket_prefix(b):
    """(the sort-key bits every key of bucket `b` shares, the rest zero; how many low bits they leave open). A bucket
    inside the window is one value of `sort_key >> 22`, so it fixes the top 10 bits; an end bucket (0, 127, 128, 255:
    magnitudes clamped into it) fixes none."""
    inside = (b != 0) & (b != 127) & (b != 128) & (b != 255)
    t = tl.where(b >= 128, b - 128 + 512 + _WINDOW_LO, 511 - (127 - b) - _WINDOW_LO)  # `bucket` inverted, inside
    return tl.where(inside, t.to(tl.uint32) << 22, 0).to(tl.uint32), tl.where(inside, 22, 32)
