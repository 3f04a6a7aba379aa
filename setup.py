"""The compiled part of kvrouter; everything else about the package is in pyproject.toml.

router.core._hotpath (router/core/hotpath-c/hotpath.c) runs the routing decision's hot loops.
It is optional: where no C compiler or Python headers exist the build goes on without it, and
router.core.hotpath falls back to the pure-Python reference.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "router.core._hotpath",
            sources=["router/core/hotpath-c/hotpath.c"],
            depends=["router/core/hotpath-c/xxhash.h"],
            optional=True,
        )
    ]
)
