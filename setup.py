"""Builds the one C extension, attnc._C, from csrc/.

ATTNC_SANITIZE=1 builds with AddressSanitizer and UBSan (see .ci/run).
"""
import glob
import os
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

compile_args = [
    "-std=c11",
    "-O3",
    # FMA contraction where the ISA has it; never -ffast-math (it would
    # compile away the NaN and infinity handling the API promises).
    "-ffp-contract=fast",
    "-fno-math-errno",
    # lets the compiler vectorise the branch-free selects of the row maxima;
    # results are unchanged (no code here reads the floating-point flags)
    "-fno-trapping-math",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]
link_args = ["-pthread"]
# ATTNC_PORTABLE_VECTOR_BYTES=32 or 64: the portable kernels take the AVX2 or
# AVX-512 vector width and tile shapes (a test build: .ci/wide_vectors.sh).
# It is built at -O1: GCC takes two minutes at -O3 over the 64-byte vectors
# it must split for a CPU without AVX-512, 25 s at -O1, and the build is for
# the tests' results, not for speed.
if os.environ.get("ATTNC_PORTABLE_VECTOR_BYTES"):
    compile_args = [a for a in compile_args if a != "-O3"] + ["-O1"]
    compile_args.append("-DATTNC_PORTABLE_BYTES=" + str(int(os.environ["ATTNC_PORTABLE_VECTOR_BYTES"])))
# ATTNC_EMULATE_BF16_DOT=1: the AVX512_BF16 level's kernels with its dot
# product emulated, offered on any AVX-512 CPU (a test build:
# .ci/bf16_dot_emulated.sh)
if os.environ.get("ATTNC_EMULATE_BF16_DOT"):
    compile_args.append("-DATTNC_EMULATE_BF16_DOT")
# ATTNC_SKIP_UNRUNNABLE_KERNELS=1: a test build for this CPU alone, without
# the kernels it cannot run: on a CPU without AVX-512 (F, VL and DQ), no
# AVX-512 or AVX512_BF16 kernels (kernels_avx512*.c left out,
# ATTNC_WITHOUT_AVX512: their levels absent from cpu.c's table). For the
# sanitizer and wide-vector builds (.ci/sanitize.sh, .ci/wide_vectors.sh):
# on 2 Zen 3 cores the ASan build took 144 s instead of 268, the 64-byte
# portable one 60 s instead of 79, for code that host never runs.
def cpu_flags():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return set(next((line for line in cpuinfo if line.startswith("flags")), "").split())
    except OSError:
        return set()


without_avx512 = bool(os.environ.get("ATTNC_SKIP_UNRUNNABLE_KERNELS")) and not {
    "avx512f", "avx512vl", "avx512dq"} <= cpu_flags()
if without_avx512:
    compile_args.append("-DATTNC_WITHOUT_AVX512")
# -g1: line tables only, all that the sanitizers' stack traces use (function,
# file and line); full debug information (-g) doubled the compile time of
# the kernel files (the AVX512_BF16 ones 20.9 s instead of 10.4).
# -O2, not -O1: at -O1 the micro-kernels' accumulator tiles stay in memory,
# every access checked; on 2 Zen 3 cores the suite under ASan took 970 s at
# -O1 and 792 s at -O2 (the two run side by side), for 39 s more of CPU to
# compile. (-O2 is also nearer the release build's -O3.)
if os.environ.get("ATTNC_SANITIZE"):
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    compile_args = [a for a in compile_args if a != "-O3"] + ["-O2", "-g1"] + sanitize
    link_args += sanitize


LONGEST_COMPILES = ["kernels_avx512.c", "kernels_avx2.c", "kernels_portable.c", "kernels_avx512bf16.c"]


class build_ext_concurrently(build_ext):
    """Compiles the extension's C files side by side, one compiler per CPU:
    the kernel files (portable, AVX2, AVX-512, AVX512_BF16) take most of a build,
    and setuptools compiles one file at a time (build_ext's --parallel only
    builds several extensions at once)."""

    def build_extension(self, ext):
        compile_files = self.compiler.compile

        def compile_each(sources, **options):
            # the longest first (most of a build is the AVX-512 kernels, then
            # AVX2's and the portable ones'), so that no core waits on one
            # file at the end: a -O3 build on 2 Zen 3 cores took 91 s in
            # file-name order, 86 s longest first
            rank = {name: i for i, name in enumerate(LONGEST_COMPILES)}
            longest_first = sorted(sources, key=lambda s: rank.get(os.path.basename(s), len(rank)))
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                objects = pool.map(lambda source: compile_files([source], **options), longest_first)
                return [obj for objs in objects for obj in objs]

        self.compiler.compile = compile_each
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile


setup(
    cmdclass={"build_ext": build_ext_concurrently},
    ext_modules=[
        Extension(
            "attnc._C",
            sources=sorted(
                path
                for path in glob.glob("csrc/*.c")
                if not (without_avx512 and os.path.basename(path).startswith("kernels_avx512"))
            ),
            depends=sorted(glob.glob("csrc/*.h")),
            include_dirs=[numpy.get_include(), "csrc"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION"), ("_GNU_SOURCE", None)],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ]
)
