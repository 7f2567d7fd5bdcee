# cmake -DCASE=<case> -DKVC_SOURCE_DIR=<kvc source dir> -P library_errors.cmake
#
# kvc_add_policy_library's refusals of a bad call (ctest package.errors.*):
# each case must stop with its message, before any file is generated.
cmake_minimum_required(VERSION 3.20)
include(${KVC_SOURCE_DIR}/codegen/KvcAddPolicyLibrary.cmake)
set(policies ${KVC_SOURCE_DIR}/policies)
set(geometry "layers=2 q-heads=4 kv-heads=2 head-dim=64 dtype=f16")
if(CASE STREQUAL "both")
  kvc_add_policy_library(lib POLICY ${policies}/h2o.mlir
    POLICIES ${policies}/snapkv.mlir GEOMETRY "${geometry}")
elseif(CASE STREQUAL "name")
  kvc_add_policy_library(lib NAME renamed
    POLICIES ${policies}/h2o.mlir ${policies}/snapkv.mlir
    GEOMETRY "${geometry}")
elseif(CASE STREQUAL "duplicate")
  kvc_add_policy_library(lib
    POLICIES ${policies}/h2o.mlir ${policies}/snapkv.mlir ${policies}/h2o.mlir
    GEOMETRY "${geometry}")
elseif(CASE STREQUAL "missing")
  kvc_add_policy_library(lib
    POLICIES ${policies}/h2o.mlir ${policies}/no_such_policy.mlir
    GEOMETRY "${geometry}")
elseif(CASE STREQUAL "extra")
  kvc_add_policy_library(lib cuda POLICY ${policies}/h2o.mlir
    GEOMETRY "${geometry}")
else()
  message(FATAL_ERROR "library_errors.cmake: unknown CASE '${CASE}'")
endif()
message(FATAL_ERROR "library_errors.cmake: case ${CASE} was accepted")
