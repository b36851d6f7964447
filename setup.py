"""Builds the one C extension, attnc._C, from csrc/.

ATTNC_SANITIZE=1 builds with AddressSanitizer and UBSan (see .ci/run).
"""
import glob
import os

import numpy
from setuptools import Extension, setup

compile_args = [
    "-std=c11",
    "-O3",
    # FMA contraction where the ISA has it; never -ffast-math (it would
    # compile away the NaN and infinity handling the API promises).
    "-ffp-contract=fast",
    "-fno-math-errno",
    # lets the compiler vectorise the branch-free selects of exp and max;
    # results are unchanged (no code here reads the floating-point flags)
    "-fno-trapping-math",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
]
link_args = ["-pthread"]
# ATTNC_PORTABLE_VECTOR_BYTES=32 or 64: the portable kernels take the AVX2 or
# AVX-512 vector width and tile shapes (a test build: .ci/wide_vectors.sh)
if os.environ.get("ATTNC_PORTABLE_VECTOR_BYTES"):
    compile_args.append("-DATTNC_PORTABLE_BYTES=" + str(int(os.environ["ATTNC_PORTABLE_VECTOR_BYTES"])))
if os.environ.get("ATTNC_SANITIZE"):
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    compile_args = [a for a in compile_args if a != "-O3"] + ["-O1", "-g"] + sanitize
    link_args += sanitize

setup(
    ext_modules=[
        Extension(
            "attnc._C",
            sources=sorted(glob.glob("csrc/*.c")),
            depends=sorted(glob.glob("csrc/*.h")),
            include_dirs=[numpy.get_include(), "csrc"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_22_API_VERSION"), ("_GNU_SOURCE", None)],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ]
)
