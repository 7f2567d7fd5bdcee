# The policies and geometries of the GPU test (GpuPolicyTest.cu), shared by
# test/gpu (built with nvcc, run on a device) and test/cudaemu (the same
# test and generated CUDA, built with the host compiler and run on the CUDA
# emulator).
#
# kvc_gpu_test_policy_file(<var> <name>): the policy file of one test policy.
# kvc_gpu_test_policies(<var> <geometry>): the policies a geometry's test
# executable links (head class tables are shaped like a geometry, so the
# DuoAttention test table exists for g3 only).

set(gpu_policies streaming_llm h2o snapkv pyramidkv pyramidkv_small
    tova adakv pyramidkv_small_adakv merge_nearest h2o_merge d2o cam
    scissorhands rpc_small kivi2 kivi4 snapkv_kivi2 snapkv_global
    mixed_precision)
# Policies of test/codegen/policies (the others are in policies/).
set(gpu_test_policies pyramidkv_small pyramidkv_small_adakv duo_small
    rpc_small)

# The geometries of test/codegen (test/codegen/CMakeLists.txt), whose CPU
# libraries kvc_test_<policy>_<g> are the comparison: they must be equal.
# layers, query heads, kv-heads, head dim, dtype.
set(geometry_g3 2 9 3 64 f16)
set(geometry_g8 1 8 1 128 bf16)
set(geometry_g1 1 2 2 64 f32)

function(kvc_gpu_test_policy_file var name)
  if(name IN_LIST gpu_test_policies)
    set(${var} ${PROJECT_SOURCE_DIR}/test/codegen/policies/${name}.mlir
        PARENT_SCOPE)
  else()
    set(${var} ${PROJECT_SOURCE_DIR}/policies/${name}.mlir PARENT_SCOPE)
  endif()
endfunction()

function(kvc_gpu_test_policies var g)
  set(names ${gpu_policies})
  if(g STREQUAL "g3")
    list(APPEND names duo_small)
  endif()
  set(${var} ${names} PARENT_SCOPE)
endfunction()

# kvc_gpu_grid_geometries(<var> [GPU]): the geometries of the grid suites:
# g3, g1 on the emulator (the 16-bit register path's attention under the
# grid's fold, which kvc-bench-gpu's fused_grid times at G = 1), and g8
# with KVC_TEST_GRID_G8 (scripts/gpu-pack.sh; the G = 8 suites differ from
# G = 3 in the group's constants only, so CI builds them once); with GPU,
# those of the suites built with nvcc (kvc_gpu_test_geometries: g3 only
# with KVC_TEST_GPU_G3; no g1, whose waits between blocks are the G = 3
# suite's).
function(kvc_gpu_grid_geometries var)
  cmake_parse_arguments(ARG "GPU" "" "" ${ARGN})
  set(gs)
  if(NOT ARG_GPU OR KVC_TEST_GPU_G3)
    list(APPEND gs g3)
  endif()
  if(NOT ARG_GPU)
    list(APPEND gs g1)
  endif()
  if(KVC_TEST_GRID_G8)
    list(APPEND gs g8)
  endif()
  set(${var} ${gs} PARENT_SCOPE)
endfunction()

# kvc_gpu_test_geometries(<var>): the geometries of the GPU suites built
# with nvcc (test/gpu): g8 and g1, and g3 with KVC_TEST_GPU_G3 (the GPU
# pack). Without a GPU those builds only compile: every policy's kernels
# for sm_80 at G = 1 and G = 8 here, and at G = 3 (the geometry of
# smollm2-135m) for sm_90a in test/codegen/cuda-nvcc*.mlir; the emulator
# runs all three (test/cudaemu).
function(kvc_gpu_test_geometries var)
  set(gs g8 g1)
  if(KVC_TEST_GPU_G3)
    list(INSERT gs 0 g3)
  endif()
  set(${var} ${gs} PARENT_SCOPE)
endfunction()

# kvc_gpu_grid_policies(<var> <geometry>): the policies of a geometry's test
# whose decode has a fold, which the grid suites (kvc-gpu-tests-<g>-grid,
# kvc-cudaemu-tests-<g>-grid) build with KVC_CUDA_FOLD_IN_GRID=1 and run
# alone; they link the other policies' libraries as they are.
function(kvc_gpu_grid_policies var g)
  set(names streaming_llm h2o tova h2o_merge d2o scissorhands rpc_small)
  if(g STREQUAL "g3")
    list(APPEND names duo_small)
  endif()
  set(${var} ${names} PARENT_SCOPE)
endfunction()

# kvc_gpu_test_bundles(<libs var> <geometry> <prefix> <make> [GRID <make>]
#                      [RUN <run var>]): the libraries a geometry's suite
# links: the policies of kvc_gpu_test_policies in two bundles (one
# translation unit each: kvc_add_policy_library's POLICIES), each made by
# <make>(<target> <geometry options> <policy file>...): <prefix>_<g>_fold,
# the policies whose decode has a fold (kvc_gpu_grid_policies), and
# <prefix>_<g>_rest, the others (made once, and shared with the grid
# suite); then every policy's CPU library kvc_test_<policy>_<g>. With GRID,
# the fold bundle is <prefix>_<g>_grid, made by the GRID function (the
# same policies with KVC_CUDA_FOLD_IN_GRID=1). RUN: the fold policies,
# comma-separated (the grid suites run those alone).
function(kvc_gpu_test_bundles libs_var g prefix make)
  cmake_parse_arguments(ARG "" "GRID;RUN" "" ${ARGN})
  kvc_gpu_test_geometry(geometry ${g})
  kvc_gpu_test_policies(names ${g})
  kvc_gpu_grid_policies(grid ${g})
  set(fold_files)
  set(rest_files)
  set(fold_names)
  set(cpu)
  foreach(name IN LISTS names)
    kvc_gpu_test_policy_file(file ${name})
    if(name IN_LIST grid)
      list(APPEND fold_files ${file})
      list(APPEND fold_names ${name})
    else()
      list(APPEND rest_files ${file})
    endif()
    list(APPEND cpu kvc_test_${name}_${g})
  endforeach()
  set(fold ${prefix}_${g}_fold)
  set(fold_make ${make})
  if(ARG_GRID)
    set(fold ${prefix}_${g}_grid)
    set(fold_make ${ARG_GRID})
  endif()
  cmake_language(CALL ${fold_make} ${fold} "${geometry}" ${fold_files})
  set(rest ${prefix}_${g}_rest)
  if(NOT TARGET ${rest})
    cmake_language(CALL ${make} ${rest} "${geometry}" ${rest_files})
  endif()
  set(${libs_var} ${fold} ${rest} ${cpu} PARENT_SCOPE)
  if(ARG_RUN)
    list(JOIN fold_names "," run)
    set(${ARG_RUN} ${run} PARENT_SCOPE)
  endif()
endfunction()

# The five numbers of geometry g as layers, qh, kvh, dim and dtype in the
# caller's scope.
macro(kvc_gpu_test_geometry_parts g)
  list(GET geometry_${g} 0 layers)
  list(GET geometry_${g} 1 qh)
  list(GET geometry_${g} 2 kvh)
  list(GET geometry_${g} 3 dim)
  list(GET geometry_${g} 4 dtype)
endmacro()

# kvc_gpu_test_definitions(<target> <geometry>): the compile definitions
# GpuPolicyTest.cu reads.
function(kvc_gpu_test_definitions target g)
  kvc_gpu_test_geometry_parts(${g})
  target_compile_definitions(${target} PRIVATE
    KVC_TEST_LAYERS=${layers} KVC_TEST_Q_HEADS=${qh} KVC_TEST_KV_HEADS=${kvh}
    KVC_TEST_HEAD_DIM=${dim} KVC_TEST_DTYPE_${dtype}=1
    $<$<STREQUAL:${g},g3>:KVC_TEST_HEAD_CLASSES=1>)
endfunction()

# kvc_gpu_test_geometry(<var> <geometry>): the --kvc-specialize options.
function(kvc_gpu_test_geometry var g)
  kvc_gpu_test_geometry_parts(${g})
  set(${var}
      "layers=${layers} q-heads=${qh} kv-heads=${kvh} head-dim=${dim} dtype=${dtype}"
      PARENT_SCOPE)
endfunction()
