"""bfloat16 on NumPy, which has none: the top 16 bits of a float32, rounded to nearest, ties to even.

    bits = bf16.encode(x)          # float32 values -> uint16 bit patterns (what travels on the wire)
    x = bf16.decode(bits)          # uint16 -> float32, exactly (the low 16 bits are zero)
    bf16.add(dst, src)             # in place on uint16 arrays: decode both, add in float32, round
    y = bf16.round_to(x, dtype)    # float64 values held in dtype (float32, float16, bfloat16), as float64

An addition decodes to float32, adds there and rounds once to bfloat16, as torch does on the CPU: two
roundings, which differ from one correctly rounded addition only when the operands' exponents are more
than 16 apart (a relative difference under 2**-24, far below bfloat16's 2**-8).
"""
import numpy as np

NAN = 0x7FC0  # a quiet NaN


def encode(x):
    """float32 -> bfloat16 bits: add 0x7FFF plus the lowest kept bit (ties go to the even one), cut."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    out[np.isnan(np.asarray(x, dtype=np.float32))] = NAN
    return out


def decode(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def add(dst, src):
    dst[:] = encode(decode(dst) + decode(src))


def round_to(x, dtype):
    """x (float64) as the nearest value of dtype, through float32 as the wire does, back as float64."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    if dtype == "bfloat16":
        return decode(encode(x32)).astype(np.float64)
    return x32.astype(dtype).astype(np.float64)


def host_add(a, b, dtype):
    """a + b (values of dtype, as float64) added in float32 and rounded to dtype: one addition as the
    ring's adds it (numpy's float16 and float32 add the same way)."""
    return round_to(a.astype(np.float32) + b.astype(np.float32), dtype)


def mpi_sum():
    """An MPI reduction op that adds uint16 buffers as bfloat16 (MPI has no bfloat16): MPI.Op.Create
    calls it with (in, inout, datatype) and wants inout = in + inout. Free() it when done."""
    from mpi4py import MPI

    def _sum(inbuf, inoutbuf, datatype):
        into = np.frombuffer(inoutbuf, dtype=np.uint16)
        add(into, np.frombuffer(inbuf, dtype=np.uint16))
    return MPI.Op.Create(_sum, commute=True)
