"""An independent NumPy oracle of every format's numerics (FORMATS.md secs. 4, 5, 10).

Written from the format descriptions, not from jqlin's code: scales are derived the way each
producer does (float32 where the producer computes in float32), products in float64.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def e4m3(x):
    return np.clip(np.asarray(x, F32), -448, 448).astype(E4M3)


def e2m1_even(x):
    return np.clip(np.asarray(x, F32), -6, 6).astype(E2M1)


def e2m1_toward_zero(x):
    grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    mag = np.abs(np.asarray(x, np.float64))
    out = np.zeros_like(mag)
    for lo, hi in zip(grid[:-1], grid[1:]):
        mid = (lo + hi) / 2
        out = np.where(mag > mid, hi, out)  # a tie stays at the lower magnitude
    return (np.sign(x) * out).astype(E2M1)


def e4m3_ties(rng, shape, s):
    """Values x = midpoint * s, each midpoint halfway between two normal e4m3 numbers, random
    signs: x / s is an e4m3 rounding tie. With s = c * 2**j, c in {1013, 2021, 4093}, 1 / s is
    inexact enough that a reciprocal multiply (or a division 1 ulp off) rounds many the other
    way."""
    e4 = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)
    e4 = e4[np.isfinite(e4) & (e4 > 0)]
    mids = ((e4[:-1] + e4[1:]) / 2)[e4[:-1] >= 2.0 ** -6]
    return rng.choice(mids, shape) * s * rng.choice([-1, 1], shape)


def nvfp4_ties(rng, m, groups):
    """Activations whose quotients x / t fall exactly on e2m1 rounding ties (0.25 .. 5) with
    block steps t whose reciprocal is inexact: a reciprocal multiply would round them the
    other way (a mutant computing x * (1 / t) fails test_numerics' NVFP4 oracle test). With
    g = 1 both rules give t = s = amax / 6."""
    e4 = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    e4 = e4[np.isfinite(e4) & (e4 >= 2.0 ** -6) & (e4 <= 64)]
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    s = rng.choice(e4, (m, groups, 1))
    x = rng.choice(ties, (m, groups, 16)) * s * rng.choice([-1, 1], (m, groups, 16))
    x[:, :, 0] = 6 * s[:, :, 0]  # the amax: x / t = 6
    return x.reshape(m, groups * 16).astype(np.float32)


def e8m0_value(u):
    u = np.asarray(u, np.int64)
    return np.where(u == 255, np.nan, np.ldexp(1.0, u - 127))


def pad_to(w, rows, cols):
    out = np.zeros((rows, cols), w.dtype)
    out[: w.shape[0], : w.shape[1]] = w
    return out


def tiles(a, tr, tc):
    r, c = a.shape
    return a.reshape(r // tr, tr, c // tc, tc)


def tile_amax(a, tr, tc):
    return np.abs(tiles(a, tr, tc)).max(axis=(1, 3))


def expand(s, tr, tc):
    return np.repeat(np.repeat(s, tr, 0), tc, 1)


def ct_mx_exponent(amax, emax):
    """u = 127 + floor(log2(p2(amax))) - emax. compressed-tensors rounds the mantissa up to the
    next power of two only from 1.75 on (it adds 2**-2 of a mantissa unit, "conservatively")."""
    u = np.zeros(amax.shape, np.int64)
    for idx, a in np.ndenumerate(amax):
        if a == 0 or np.isnan(a):  # NaN: the NaN scale (torchao's MX reference)
            u[idx] = 255 if np.isnan(a) else 0
            continue
        if np.isinf(a):  # the bits' exponent field, 255 (torchao's reading; CT's torch casts
            u[idx] = min(255 - emax, 254)  # floor(log2(inf)) to int32, which is undefined)
            continue
        f, e = math.frexp(float(a))  # a = f * 2**e, f in [0.5, 1)
        exp = (e - 1) + (1 if 2 * f >= 1.75 else 0)
        u[idx] = min(max(127 + exp - emax, 0), 254)
    return u


def modelopt_mx_exponent(amax, elem_max):
    """The unbiased exponent e (u = e + 127); 128 for a NaN amax (u = 255, the NaN scale)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.ceil(np.log2(amax.astype(F32) / F32(elem_max)))
    e = np.clip(np.where(amax > 0, e, -127), -127, 127)
    return np.where(np.isnan(amax), 128, e).astype(np.int64)


# ---------------------------------------------------------------------------------------------
def weight_fp8(w32, tr, tc):
    """fp8 weight with float32 scales over (tr, tc) tiles (w32 float32, pre-padded)."""
    s = tile_amax(w32, tr, tc) / F32(448)
    s = np.where(s == 0, np.finfo(F32).eps, s).astype(F32)
    q = e4m3(w32 / expand(s, tr, tc))
    return q, s, q.astype(np.float64) * expand(s, tr, tc).astype(np.float64)


def weight_mx(w32, group, fp4, rule="ct"):
    amax = tile_amax(w32, 1, group)
    if rule == "ct":
        u = ct_mx_exponent(amax, 2 if fp4 else 8)
        scaled = w32 / expand(e8m0_value(u).astype(F32), 1, group)
        q = e2m1_even(scaled) if fp4 else e4m3(scaled)
    else:
        u = modelopt_mx_exponent(amax, 6 if fp4 else 448) + 127
        scaled = w32 / expand(e8m0_value(u).astype(F32), 1, group)
        q = e2m1_toward_zero(scaled) if fp4 else e4m3(scaled)
    deq = q.astype(np.float64) * expand(e8m0_value(u), 1, group)
    return q, u.astype(np.uint8), deq


def weight_nvfp4_ct(w32, group=16):
    amax = np.abs(w32).max()
    g = F32(2688) / F32(amax) if amax > 0 else F32(1)
    s = e4m3(g * tile_amax(w32, 1, group) / F32(6)).astype(F32)
    s = np.where(s == 0, F32(0.125), s)
    t = (s / g).astype(F32)
    q = e2m1_even(w32 / expand(t, 1, group))
    deq = q.astype(np.float64) * expand(t, 1, group).astype(np.float64)
    return q, s.astype(E4M3), g, deq


def weight_nvfp4_modelopt(w32, group=16):
    amax = np.abs(w32).max()
    g = F32(amax) / F32(2688) if amax > 0 else F32(1)
    b = (tile_amax(w32, 1, group) / (F32(6) * g)).astype(F32)
    s = e4m3(np.where(b == 0, 1, np.maximum(b, F32(2.0 ** -9)))).astype(F32)
    t = (s * g).astype(F32)
    q = e2m1_even(w32 / expand(t, 1, group))
    deq = q.astype(np.float64) * expand(t, 1, group).astype(np.float64)
    return q, s.astype(E4M3), g, deq


# ---------------------------------------------------------------------------------------------
def act_fp8_static(x32, s, rule="ct"):
    s = F32(s)
    if rule == "modelopt":
        inv = F32(448) / (s * F32(448))
        return e4m3(x32 * inv).astype(np.float64) * np.float64(F32(1) / inv)
    return e4m3(x32 / s).astype(np.float64) * np.float64(s)


def act_fp8_dynamic(x32, group=None, vllm=False, amax_bound=None):
    """amax_bound: fbgemm's activation_scale_ub, the amax taken as at most that float32."""
    m, k = x32.shape
    tc = k if group is None else group
    amax = tile_amax(x32, 1, tc)
    if amax_bound is not None:
        amax = np.minimum(amax, F32(amax_bound))
    s = amax / F32(448)
    s = np.maximum(s, F32(1 / (448 * 512))) if vllm else np.where(s == 0, np.finfo(F32).eps, s)
    s = s.astype(F32)
    return e4m3(x32 / expand(s, 1, tc)).astype(np.float64) * expand(s, 1, tc)


def act_mx(x32, group, fp4, rule="ct"):
    _, _, deq = weight_mx(x32, group, fp4, rule)
    if rule == "modelopt":  # ModelOpt multiplies by 2**-e rather than dividing by 2**e
        amax = tile_amax(x32, 1, group)
        e = modelopt_mx_exponent(amax, 6 if fp4 else 448)
        scaled = x32 * expand(e8m0_value(127 - e).astype(F32), 1, group)
        q = e2m1_toward_zero(scaled) if fp4 else e4m3(scaled)
        deq = q.astype(np.float64) * expand(e8m0_value(e + 127), 1, group)
    return deq


def act_fp8_ue8m0(x32, group=128):
    """DeepSeek's `scale_fmt: "ue8m0"` activations (its inference kernel's act_quant with
    round_scale): amax floored at 1e-4, times float32(1/448), rounded up to a power of two;
    codes e4m3(clip(x / s)). The ceiling by frexp (not the kernel's bit reading). Returns the
    float64 dequantized values and the scales."""
    amax = np.maximum(tile_amax(x32, 1, group), F32(1e-4))
    t = (amax * F32(1 / 448)).astype(F32)
    s = np.empty(t.shape, np.float64)
    for idx, v in np.ndenumerate(t):
        if not np.isfinite(v):
            s[idx] = np.nan  # inf / NaN amax: the NaN scale (its row's outputs are NaN)
            continue
        f, e = math.frexp(float(v))  # v = f * 2**e, f in [0.5, 1)
        s[idx] = math.ldexp(1.0, e - 1 if f == 0.5 else e)
    with np.errstate(invalid="ignore"):
        q = e4m3(x32 / expand(s, 1, group).astype(F32))
    return q.astype(np.float64) * expand(s, 1, group), s


def act_nvfp4(x32, global_scale, rule="ct", group=16):
    amax = tile_amax(x32, 1, group)
    g = F32(global_scale)
    if rule == "ct":
        s = e4m3(g * amax / F32(6)).astype(F32)
        s = np.where(s == 0, F32(0.125), s)
        t = (s / g).astype(F32)
    else:
        b = (amax / (F32(6) * g)).astype(F32)
        b = np.where(b == 0, F32(1), b)
        t = (e4m3(np.clip(b, F32(2.0 ** -9), 448)).astype(F32) * g).astype(F32)
    q = e2m1_even(x32 / expand(t, 1, group))
    return q.astype(np.float64) * expand(t, 1, group).astype(np.float64)
