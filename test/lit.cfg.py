# -*- Python -*-
# lit configuration of the kvc test suite.

import os
import shutil

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "KVC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir"]
config.test_source_root = config.kvc_lit_source_root
config.test_exec_root = config.kvc_lit_exec_root

# Strict FileCheck: variables are scoped to their CHECK-LABEL block and every
# prefix named on a RUN line must be used.
config.environment["FILECHECK_OPTS"] = (
    "-enable-var-scope --allow-unused-prefixes=false"
)

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%kvc_src_root", config.kvc_src_root))

llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])
llvm_config.use_default_substitutions()

config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
tool_dirs = [config.kvc_tools_dir, config.llvm_tools_dir]
tools = ["kvc-opt"]
llvm_config.add_tool_substitutions(tools, tool_dirs)

# The RUN lines' compilers go through ccache where the build does
# (CMakeLists.txt), with the cache scripts/build.sh uses: the nvcc lines
# compile the same generated sources on every run (ccache passes -ptx
# compiles through uncached, and the result is nvcc's either way).
launcher = ""
if config.ccache and os.path.exists(config.ccache):
    launcher = config.ccache + " "
    config.environment["CCACHE_DIR"] = os.environ.get(
        "CCACHE_DIR", os.path.expanduser("~/.cache/kvc-ccache")
    )
    config.environment["CCACHE_BASEDIR"] = config.kvc_src_root
    # ccache 4.7 hashes nvcc's working directory (its log says so), which
    # ties the cached objects to one checkout's path: a fresh clone
    # elsewhere missed them all. The RUN lines compile without debug
    # information, the only output that would name the directory.
    config.environment["CCACHE_NOHASHDIR"] = "1"

# The host C++ compiler, to compile generated CPU code that no bundled
# policy exercises (the bundled ones are built and run by ctest).
# The CMake of the build, for its script-mode files (codegen/*.cmake).
config.substitutions.append(("%cmake", config.cmake_command))

cxx = shutil.which("c++") or shutil.which("g++")
if cxx:
    config.available_features.add("cxx")
    config.substitutions.append(("%cxx", launcher + cxx))

if config.cuda_nvcc and os.path.exists(config.cuda_nvcc):
    config.available_features.add("nvcc")
    # nvcc 13 accepts g++-12 as host compiler; prefer it where it exists.
    nvcc = launcher + config.cuda_nvcc
    if shutil.which("g++-12"):
        nvcc += " -ccbin g++-12"
    config.substitutions.append(("%nvcc", nvcc))
