# kvc_cuda_directory(<what>): the start of a directory that builds CUDA code
# against the kvc runtime only (test/gpu, bench/gpu). Enables CUDA when
# CMake finds a compiler; otherwise prints that <what> is not built and
# returns from the calling directory (a macro, so return() leaves it).
# LLVM's global flags (definitions, -Wl,-z,defs, C++ flags) stop here.
macro(kvc_cuda_directory what)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "kvc: no CUDA compiler found; ${what} is not built")
    return()
  endif()
  enable_language(CUDA)
  set_property(DIRECTORY PROPERTY COMPILE_DEFINITIONS "")
  set_property(DIRECTORY PROPERTY COMPILE_OPTIONS "")
  set(CMAKE_EXE_LINKER_FLAGS "")
  set(CMAKE_SHARED_LINKER_FLAGS "")
  set(CMAKE_CXX_FLAGS "")
  find_package(CUDAToolkit REQUIRED)
endmacro()
