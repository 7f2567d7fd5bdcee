# cmake -DBACKEND=cpu|cuda -DPOLICIES=<name>[;<name>...] -DOUTPUT=<file>
#       [-DSUFFIX=<source suffix>] -P KvcPolicyBundle.cmake
#
# Writes the translation unit that kvc_add_policy_library's POLICIES
# compiles (kvc_policy_bundle_source), for builds that run kvc-opt
# themselves: the generated sources kvc_<name>_<backend>.cpp / .cu (or
# SUFFIX, with its dot) of the policies, which must be in OUTPUT's
# directory or on the include path, compiled together. Leaves OUTPUT as it
# is when its text would not change.
cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/KvcAddPolicyLibrary.cmake)
if(NOT BACKEND STREQUAL "cpu" AND NOT BACKEND STREQUAL "cuda")
  message(FATAL_ERROR
    "KvcPolicyBundle.cmake: BACKEND must be cpu or cuda, not '${BACKEND}'")
endif()
if(NOT POLICIES OR NOT OUTPUT)
  message(FATAL_ERROR "KvcPolicyBundle.cmake: POLICIES and OUTPUT are required")
endif()
foreach(name IN LISTS POLICIES)
  if(NOT name MATCHES "^[A-Za-z0-9_]+$")
    message(FATAL_ERROR
      "KvcPolicyBundle.cmake: '${name}' is not a policy name")
  endif()
endforeach()
if(NOT DEFINED SUFFIX)
  set(SUFFIX .cpp)
  if(BACKEND STREQUAL "cuda")
    set(SUFFIX .cu)
  endif()
endif()
kvc_policy_bundle_source(text ${BACKEND} ${SUFFIX} ${POLICIES})
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
