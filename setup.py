"""Build script: the C++ core in csrc/ plus its one Cython binding, cythonized at build time.

The extension's sources compile in parallel, one per core the build may use
(``LATTICEKIT_BUILD_JOBS`` sets how many): setuptools compiles an extension's sources one after
another (its ``--parallel`` runs extensions, not sources, side by side). On a 2-core VM the build
took 50 s one source at a time and takes 30 s two at a time.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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


def build_jobs():
    """Compilers to run at once: ``LATTICEKIT_BUILD_JOBS``, else the cores this process may use."""
    jobs = os.environ.get("LATTICEKIT_BUILD_JOBS", "").strip()
    if jobs:
        if not jobs.isdigit() or int(jobs) < 1:
            raise SystemExit(f"LATTICEKIT_BUILD_JOBS must be an integer >= 1, got {jobs!r}")
        return int(jobs)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class ParallelBuildExt(build_ext):
    """``build_ext`` whose compiler compiles an extension's sources in parallel threads (each
    compiler is a subprocess). Only the Unix compiler, whose ``compile`` is setuptools' own loop
    over ``_compile``; another (MSVC) compiles as setuptools does."""

    def build_extensions(self):
        compiler = self.compiler
        jobs = build_jobs()
        if compiler.compiler_type == "unix" and jobs > 1:
            def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                        extra_postargs=None, depends=None):
                # what CCompiler.compile does, its loop over the objects run by a pool
                macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                    output_dir, macros, include_dirs, sources, depends, extra_postargs)
                cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

                def one(obj):
                    if obj in build:  # absent: up to date
                        src, ext = build[obj]
                        compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

                with ThreadPoolExecutor(jobs) as pool:
                    list(pool.map(one, objects))
                return objects

            compiler.compile = compile
        super().build_extensions()


setup(ext_modules=cythonize(extensions, language_level=3), cmdclass={"build_ext": ParallelBuildExt})
