"""common.bandwidth: busbw factors, size sweeps, the busbw explanation, the terminal chart (no MPI)."""
import pytest

from common import bandwidth


@pytest.mark.parametrize("op,n,want", [("allreduce", 4, 1.5), ("allreduce", 2, 1.0), ("allreduce", 1, 0.0),
                                       ("allgather", 4, 0.75), ("reducescatter", 8, 0.875),
                                       ("broadcast", 8, 1.0), ("reduce", 3, 1.0), ("sendrecv", 2, 1.0)])
def test_factor(op, n, want):
    assert bandwidth.factor(op, n) == pytest.approx(want)


def test_algbw_busbw_units():
    # 1e9 bytes in 1 s is 1 GB/s (GB = 1e9, as nccl-tests); all-reduce on 8 ranks carries 2*7/8 of it
    assert bandwidth.algbw(10 ** 9, 1.0) == pytest.approx(1.0)
    assert bandwidth.busbw("allreduce", 10 ** 9, 0.5, 8) == pytest.approx(2.0 * 1.75)
    assert bandwidth.algbw(100, 0.0) == 0.0


def test_bad_op_and_ranks():
    with pytest.raises(ValueError, match="unknown op"):
        bandwidth.factor("allreduse", 4)
    with pytest.raises(ValueError):
        bandwidth.factor("allreduce", 0)


@pytest.mark.parametrize("text,want", [("8", 8), ("64K", 65536), ("128M", 128 * 2 ** 20), ("1G", 2 ** 30),
                                       ("4kb", 4096), (" 2M ", 2 * 2 ** 20)])
def test_parse_size(text, want):
    assert bandwidth.parse_size(text) == want


@pytest.mark.parametrize("text", ["", "K", "-8", "1.5M", "8T", "abc"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        bandwidth.parse_size(text)


def test_sizes_like_nccl_tests():
    s = bandwidth.sizes("8", "128M", 2)
    assert s[0] == 8 and s[-1] == 128 * 2 ** 20 and len(s) == 25
    assert all(b == 2 * a for a, b in zip(s, s[1:]))
    assert bandwidth.sizes("64K", "1M", 4) == [65536, 262144, 1048576]
    assert bandwidth.sizes("8", "100", 8) == [8, 64]  # stops before passing -e
    assert bandwidth.sizes("1K", "1K", 2) == [1024]


@pytest.mark.parametrize("b,e,f", [("1M", "1K", 2), ("0", "8", 2), ("8", "64", 1)])
def test_sizes_rejects(b, e, f):
    with pytest.raises(ValueError):
        bandwidth.sizes(b, e, f)


def test_explain_spells_out_the_arithmetic():
    text = bandwidth.explain("allreduce", 1_000_000, 100.0, 4)
    assert "algbw = bytes / time = 1000000 B / 100 us = 10 GB/s" in text
    assert "2(n-1)/n = 10 * 1.5 = 15 GB/s" in text
    with pytest.raises(ValueError):
        bandwidth.explain("allreduce", 10, 0, 4)


def test_chart_scales_bars_to_the_largest():
    text = bandwidth.chart([1024, 2048], {"ring": [1.0, 2.0], "library": [0.5, 1.0]}, width=10)
    lines = text.splitlines()
    assert "#" * 10 + " 2" in lines[3] and "=" * 5 + " 1" in lines[4] and lines[1].startswith("    1K")

