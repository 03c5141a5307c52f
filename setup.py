"""Build script: the C++ core in csrc/ plus its one Cython binding, cythonized at build time."""

import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CORE_SOURCES = [
    "csrc/latticekit/acceptance.cc",
    "csrc/latticekit/arpa.cc",
    "csrc/latticekit/continuations.cc",
    "csrc/latticekit/corpus.cc",
    "csrc/latticekit/counting.cc",
    "csrc/latticekit/model.cc",
    "csrc/latticekit/model_build.cc",
    "csrc/latticekit/model_format.cc",
    "csrc/latticekit/ngram_cache.cc",
    "csrc/latticekit/search.cc",
    "csrc/latticekit/search_batch.cc",
    "csrc/latticekit/storage.cc",
    "csrc/latticekit/successors.cc",
    "csrc/latticekit/trie.cc",
]

compile_args = ["-std=c++17", "-O3", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
link_args = []
if sys.platform != "win32":
    compile_args.append("-pthread")
    link_args.append("-pthread")

extensions = [
    Extension(
        "latticekit._core",
        sources=["latticekit/_core.pyx"] + CORE_SOURCES,
        include_dirs=["csrc", numpy.get_include()],
        language="c++",
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(ext_modules=cythonize(extensions, language_level=3))
