# kvc_add_policy_library(<target>
#     POLICY <file.mlir>
#     TARGETS cpu [cuda]
#     GEOMETRY model=<name> | "layers=L q-heads=Q kv-heads=K head-dim=D dtype=T"
#     [NAME <name>]
#     [UNFUSED])
#
# Compiles a kvc policy into a static library target: runs kvc-opt to
# specialize the policy to the geometry, form its kernels and emit the
# sources into ${CMAKE_CURRENT_BINARY_DIR}/<target>/, then builds them.
# The target links the kvc runtime and exposes the generated header
# kvc_<policy>_cpu.h (the policy name is the symbol of its kvc.policy op,
# or NAME, which renames it so that variants can be linked side by side).
# With `cuda` the same library also holds the CUDA backend (kvc_<policy>_
# cuda.cu, header kvc_<policy>_cuda.h) and links CUDA::cudart: the calling
# project must have enabled the CUDA language and found CUDAToolkit.
#
# Needs KVC_OPT_EXECUTABLE (the kvc-opt to run) and KVC_RUNTIME_TARGET (the
# runtime library target); find_package(kvc) and the kvc build set both.
function(kvc_add_policy_library target)
  cmake_parse_arguments(ARG "UNFUSED" "POLICY;NAME" "TARGETS;GEOMETRY" ${ARGN})
  if(NOT ARG_POLICY)
    message(FATAL_ERROR "kvc_add_policy_library(${target}): POLICY is required")
  endif()
  if(NOT ARG_GEOMETRY)
    message(FATAL_ERROR "kvc_add_policy_library(${target}): GEOMETRY is required")
  endif()
  if(NOT ARG_TARGETS)
    set(ARG_TARGETS cpu)
  endif()
  foreach(t IN LISTS ARG_TARGETS)
    if(NOT t STREQUAL "cpu" AND NOT t STREQUAL "cuda")
      message(FATAL_ERROR
        "kvc_add_policy_library(${target}): unknown target '${t}' (cpu, cuda)")
    endif()
  endforeach()
  if("cuda" IN_LIST ARG_TARGETS)
    get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
    if(NOT "CUDA" IN_LIST languages OR NOT TARGET CUDA::cudart)
      message(FATAL_ERROR "kvc_add_policy_library(${target}): TARGETS cuda "
        "needs enable_language(CUDA) and find_package(CUDAToolkit) first")
    endif()
  endif()
  get_filename_component(policy_file "${ARG_POLICY}" ABSOLUTE)
  if(NOT EXISTS "${policy_file}")
    message(FATAL_ERROR
      "kvc_add_policy_library(${target}): no policy file ${policy_file}")
  endif()
  file(STRINGS "${policy_file}" policy_lines REGEX "^[ \t]*kvc\\.policy @")
  list(LENGTH policy_lines num_policies)
  if(NOT num_policies EQUAL 1)
    message(FATAL_ERROR "kvc_add_policy_library(${target}): "
      "${policy_file} must hold exactly one kvc.policy")
  endif()
  string(REGEX REPLACE "^[ \t]*kvc\\.policy @([A-Za-z0-9_]+).*$" "\\1"
         policy_name "${policy_lines}")

  string(REPLACE ";" " " geometry "${ARG_GEOMETRY}")
  if(ARG_NAME)
    set(policy_name ${ARG_NAME})
    string(APPEND geometry " name=${ARG_NAME}")
  endif()
  set(form "--kvc-form-kernels")
  if(ARG_UNFUSED)
    set(form "--kvc-form-kernels=unfused=1")
  endif()
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  set(all_sources)
  foreach(t IN LISTS ARG_TARGETS)
    set(ext cpp)
    if(t STREQUAL "cuda")
      set(ext cu)
    endif()
    set(sources "${out_dir}/kvc_${policy_name}_${t}.${ext}")
    set(headers "${out_dir}/kvc_${policy_name}_${t}.h")
    add_custom_command(
      OUTPUT ${sources} ${headers}
      COMMAND ${CMAKE_COMMAND} -E make_directory "${out_dir}"
      COMMAND "${KVC_OPT_EXECUTABLE}" "${policy_file}"
              "--kvc-specialize=${geometry}" ${form}
              "--kvc-emit=target=${t} output-dir=${out_dir}" -o /dev/null
      DEPENDS "${policy_file}" ${KVC_OPT_EXECUTABLE}
      COMMENT "kvc: compiling policy @${policy_name} for ${t} into ${target}"
      VERBATIM)
    list(APPEND all_sources ${sources} ${headers})
  endforeach()
  add_library(${target} STATIC ${all_sources})
  target_include_directories(${target} PUBLIC "${out_dir}")
  target_link_libraries(${target} PUBLIC ${KVC_RUNTIME_TARGET})
  target_compile_features(${target} PUBLIC cxx_std_17)
  if("cuda" IN_LIST ARG_TARGETS)
    target_link_libraries(${target} PUBLIC CUDA::cudart)
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 17)
  endif()
  if(TARGET kvc-opt)
    add_dependencies(${target} kvc-opt)
  endif()
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
