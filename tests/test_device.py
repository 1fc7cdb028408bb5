"""astrai.device: what a CPU's /proc/cpuinfo says about bf16 instructions."""

from astrai.device import cpu_flags_have_bf16

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd asimddp\n"


def test_bf16_flags_are_read_from_cpuinfo():
    assert cpu_flags_have_bf16(SAPPHIRE) and cpu_flags_have_bf16(GRAVITON3)
    assert not cpu_flags_have_bf16(SKYLAKE) and not cpu_flags_have_bf16(GRAVITON2)
    assert not cpu_flags_have_bf16("model name\t: bf16 in a name is no flag\n")
