"""The compiled part of kvrouter; everything else about the package is in pyproject.toml.

router.core._hotpath (router/core/hotpath-c/hotpath.c) runs the routing decision's hot loops.
It is optional: where no C compiler or Python headers exist the build goes on without it, and
router.core.hotpath falls back to the pure-Python reference.
"""

import sys

from setuptools import Extension, setup

# The compiled scores must equal the reference's to the last bit: a multiply-add fused into one
# instruction (which compilers may emit where the machine has one) rounds once instead of twice.
EXACT_FLOATS = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "router.core._hotpath",
            sources=[
                "router/core/hotpath-c/hotpath.c",
                "router/core/hotpath-c/scoring.c",
                "router/core/hotpath-c/otlp.c",
                "router/core/hotpath-c/lru.c",
            ],
            depends=["router/core/hotpath-c/hotpath.h", "router/core/hotpath-c/xxhash.h"],
            extra_compile_args=EXACT_FLOATS,
            optional=True,
        )
    ]
)
