# The policies of the GPU benchmark, shared by bench/gpu (kvc-bench-gpu,
# built with nvcc) and test/cudaemu (its --check run on the CUDA emulator).
#
# The policies compiled per geometry (all in one executable, renamed so
# that they link side by side):
#   plain   policies/snapkv.mlir: decode is attention only (no decode
#           statistics, no eviction, no synchronization); its prefill is
#           SnapKV's compression (window statistics).
#   fused   bench/policies/h2o_decode.mlir: the H2O decode step
#           (accumulated attention, victim selection) with a budget no
#           context reaches, so the cache keeps its length; its prefill is
#           a plain prefill (attention, every entry stored).
#   unfused the same policy, --kvc-form-kernels=unfused=1.
#   h2o     policies/h2o.mlir, for its prefill (accumulated statistics over
#           every prompt query, budget 1024).
#   kivi2   policies/kivi2.mlir: int2 KIVI decode (a KIVI device pool;
#   kivi4   policies/kivi4.mlir: int4) against plain's 16-bit decode.
set(gpu_bench_policy_plain ${PROJECT_SOURCE_DIR}/policies/snapkv.mlir)
set(gpu_bench_policy_fused ${PROJECT_SOURCE_DIR}/bench/policies/h2o_decode.mlir)
set(gpu_bench_policy_unfused ${PROJECT_SOURCE_DIR}/bench/policies/h2o_decode.mlir)
set(gpu_bench_policy_h2o ${PROJECT_SOURCE_DIR}/policies/h2o.mlir)
set(gpu_bench_policy_kivi2 ${PROJECT_SOURCE_DIR}/policies/kivi2.mlir)
set(gpu_bench_policy_kivi4 ${PROJECT_SOURCE_DIR}/policies/kivi4.mlir)
set(gpu_bench_variants plain fused unfused h2o kivi2 kivi4)

# Alternatives: the same policies built with a kernel choice overridden
# (runtime/kvc_cuda.cuh, "Build-time overrides"), under their own names so
# that they link beside the defaults and the benchmark times both in one
# run. Compiled for the geometries that have a choice: those of
# gpu_bench_alternatives at G >= 2, those of gpu_bench_g1_alternatives at
# G = 1 (kivi2's, where it runs decodeKiviTiles, and fused's launches and
# logits; the 16-bit decodes have no tensor-core or staged path there).
#   plain_cc    plain's decode without tensor cores (KVC_CUDA_TENSOR_CORES=0:
#               the shared-memory tiles of decodeStagedRows)
#   kivi2_cc    kivi2's decode on CUDA cores (decodeKiviTiles)
#   kivi2_free  kivi2's tensor-core decode without launch bounds
#               (KVC_CUDA_KIVI_MMA_BLOCKS=0: registers left to ptxas)
#   prefill_cc  fused's plain prefill with its attention on CUDA cores
#               (KVC_CUDA_PREFILL_MMA=0: prefillAttentionTiles)
#   h2o_cc      h2o's prefill with attention and accumulated statistics on
#               CUDA cores (KVC_CUDA_PREFILL_MMA=0: prefillAttentionTiles,
#               prefillColumnStatsTiles)
#   fused_lru   fused's decode reading the cache under the default L2
#               policy (KVC_CUDA_EVICT_FIRST=0: its logits and score state
#               compete with the cache's lines for L2 until the fold)
#   fused_split fused's decode with one fold block per attention split
#               (KVC_CUDA_FOLD_PLAN=0), against planFold's one wave
#   plain_len   plain's decode with its attention split by length only
#               (KVC_CUDA_SPLIT_PLAN=0), against planSplits' whole waves
#   plain_late  plain's decode issuing a tile's copies after the wait for
#               the tile before (KVC_CUDA_ISSUE_AHEAD=0), against before it
#   fused_serial fused's decode with its attention and fold kernels launched
#               as ordinary kernels (KVC_CUDA_DEPENDENT_LAUNCH=0), against
#               programmatic dependents of the kernel before each
#   fused_first fused's decode with a fold that asks L2 for its first pass
#               of slots only (KVC_CUDA_FOLD_AHEAD=0), against the passes
#               two ahead of its loads
#   plain_regq  plain's decode with the tensor-core query fragments in each
#               thread's registers (KVC_CUDA_MMA_SHARED_QUERY=0: three
#               blocks per SM at head dim 128), against shared memory (four)
#   plain_rowv  plain's decode with the weights as A of its tensor-core
#               value sums at every group (KVC_CUDA_MMA_TRANSPOSED_VALUES=0:
#               8 channels an mma), against the values as A at G <= 4 (16)
#   kivi2_rowv  kivi2's decode likewise (KVC_CUDA_MMA_TRANSPOSED_VALUES=0),
#               against the codes' units as A at G <= 4, head dim 128
#   fused_keep  fused's decode with a fold that leaves its logits in L2
#               (KVC_CUDA_DISCARD_LOGITS=0: written back as L2 evicts
#               them), against a fold that drops them once read
#   fused_norm  fused's decode with its logits stored under the default L2
#               policy (KVC_CUDA_LOGITS_EVICT_LAST=0), against a share of
#               them as large as half of L2 stored evict-last
#   fused_grid  fused's decode with its statistics folded in the attention
#               grid (KVC_CUDA_FOLD_IN_GRID=1, decodeAttentionFold), against
#               a fold kernel after the attention
#   kivi2_late  kivi2's decode loading a tile's positions and KIVI words
#               when it enters the tile (KVC_CUDA_ISSUE_AHEAD=0), against
#               copying them into shared memory a tile ahead
#   kivi2_b5    kivi2's tensor-core decode with launch bounds for five
#               blocks per SM (KVC_CUDA_KIVI_MMA_BLOCKS=5: 96 registers),
#               against four (128)
#   kivi2_b9    kivi2's CUDA-core decode at G = 1 (decodeKiviTiles) with
#               launch bounds for nine blocks per SM
#               (KVC_CUDA_KIVI_TILE_BLOCKS=9: 56 registers), against none
#               (64 registers: eight blocks)
set(gpu_bench_alternatives plain_cc kivi2_cc kivi2_free prefill_cc h2o_cc
    fused_lru fused_split plain_len plain_late fused_serial fused_first
    plain_regq plain_rowv kivi2_rowv fused_keep fused_norm fused_grid
    kivi2_late kivi2_b5)
set(gpu_bench_g1_alternatives kivi2_late kivi2_b9 fused_serial fused_keep
    fused_norm fused_grid)
set(gpu_bench_alternative_policy_plain_cc ${gpu_bench_policy_plain})
set(gpu_bench_alternative_defines_plain_cc KVC_CUDA_TENSOR_CORES=0)
set(gpu_bench_alternative_policy_kivi2_cc ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_cc KVC_CUDA_TENSOR_CORES=0)
set(gpu_bench_alternative_policy_kivi2_free ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_free KVC_CUDA_KIVI_MMA_BLOCKS=0)
set(gpu_bench_alternative_policy_prefill_cc ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_prefill_cc KVC_CUDA_PREFILL_MMA=0)
set(gpu_bench_alternative_policy_h2o_cc ${gpu_bench_policy_h2o})
set(gpu_bench_alternative_defines_h2o_cc KVC_CUDA_PREFILL_MMA=0)
set(gpu_bench_alternative_policy_fused_lru ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_lru KVC_CUDA_EVICT_FIRST=0)
set(gpu_bench_alternative_policy_fused_split ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_split KVC_CUDA_FOLD_PLAN=0)
set(gpu_bench_alternative_policy_plain_len ${gpu_bench_policy_plain})
set(gpu_bench_alternative_defines_plain_len KVC_CUDA_SPLIT_PLAN=0)
set(gpu_bench_alternative_policy_plain_late ${gpu_bench_policy_plain})
set(gpu_bench_alternative_defines_plain_late KVC_CUDA_ISSUE_AHEAD=0)
set(gpu_bench_alternative_policy_fused_serial ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_serial KVC_CUDA_DEPENDENT_LAUNCH=0)
set(gpu_bench_alternative_policy_fused_first ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_first KVC_CUDA_FOLD_AHEAD=0)
set(gpu_bench_alternative_policy_plain_regq ${gpu_bench_policy_plain})
set(gpu_bench_alternative_defines_plain_regq KVC_CUDA_MMA_SHARED_QUERY=0)
set(gpu_bench_alternative_policy_plain_rowv ${gpu_bench_policy_plain})
set(gpu_bench_alternative_defines_plain_rowv KVC_CUDA_MMA_TRANSPOSED_VALUES=0)
set(gpu_bench_alternative_policy_kivi2_rowv ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_rowv KVC_CUDA_MMA_TRANSPOSED_VALUES=0)
set(gpu_bench_alternative_policy_fused_keep ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_keep KVC_CUDA_DISCARD_LOGITS=0)
set(gpu_bench_alternative_policy_fused_norm ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_norm KVC_CUDA_LOGITS_EVICT_LAST=0)
set(gpu_bench_alternative_policy_fused_grid ${gpu_bench_policy_fused})
set(gpu_bench_alternative_defines_fused_grid KVC_CUDA_FOLD_IN_GRID=1)
set(gpu_bench_alternative_policy_kivi2_late ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_late KVC_CUDA_ISSUE_AHEAD=0)
set(gpu_bench_alternative_policy_kivi2_b5 ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_b5 KVC_CUDA_KIVI_MMA_BLOCKS=5)
set(gpu_bench_alternative_policy_kivi2_b9 ${gpu_bench_policy_kivi2})
set(gpu_bench_alternative_defines_kivi2_b9 KVC_CUDA_KIVI_TILE_BLOCKS=9)

# The libraries of one geometry are bundles, each compiled as one
# translation unit (kvc_policy_bundle_source, codegen/KvcAddPolicyLibrary.
# cmake), so that the kernels their policies share compile once: the
# variants in one (key `defaults`), and the alternatives that take the same
# overrides in one each (key: the overrides, lowercase, without KVC_CUDA_).
# gpu_bench_bundles: the keys; gpu_bench_bundle_defines_<key>: its
# overrides; its members (variants or alternatives) at a group:
# kvc_gpu_bench_bundle_members.
set(gpu_bench_bundles defaults)
set(gpu_bench_bundle_defines_defaults)
foreach(where IN ITEMS gn g1)
  set(alternatives ${gpu_bench_alternatives})
  if(where STREQUAL "g1")
    set(alternatives ${gpu_bench_g1_alternatives})
  endif()
  foreach(alt IN LISTS alternatives)
    string(TOLOWER "${gpu_bench_alternative_defines_${alt}}" key)
    string(REPLACE "kvc_cuda_" "" key "${key}")
    string(REGEX REPLACE "[^a-z0-9]+" "_" key "${key}")
    if(NOT key IN_LIST gpu_bench_bundles)
      list(APPEND gpu_bench_bundles ${key})
      set(gpu_bench_bundle_defines_${key} ${gpu_bench_alternative_defines_${alt}})
    endif()
    list(APPEND gpu_bench_${where}_members_${key} ${alt})
  endforeach()
endforeach()

# kvc_gpu_bench_geometry(<dim var> <group var> <geometry>): the head dim
# and GQA group of a "head_dim:group" geometry.
function(kvc_gpu_bench_geometry dim_var group_var geometry)
  string(REPLACE ":" ";" parts "${geometry}")
  list(GET parts 0 dim)
  list(GET parts 1 group)
  set(${dim_var} ${dim} PARENT_SCOPE)
  set(${group_var} ${group} PARENT_SCOPE)
endfunction()

# kvc_gpu_bench_bundle_members(<var> <key> <group>): the members of bundle
# <key> at GQA group <group>: the variants (key `defaults`) at every group;
# the bundle's alternatives of gpu_bench_alternatives at G >= 2, of
# gpu_bench_g1_alternatives at G = 1; empty where it has none there (the
# bundle is not built for that geometry).
function(kvc_gpu_bench_bundle_members var key group)
  if(key STREQUAL "defaults")
    set(members ${gpu_bench_variants})
  elseif(group GREATER 1)
    set(members ${gpu_bench_gn_members_${key}})
  else()
    set(members ${gpu_bench_g1_members_${key}})
  endif()
  set(${var} ${members} PARENT_SCOPE)
endfunction()

# kvc_gpu_bench_member(<file var> <form var> <variant or alternative>): its
# policy file and kvc-opt's --kvc-form-kernels option.
function(kvc_gpu_bench_member file_var form_var member)
  set(form --kvc-form-kernels)
  if(member IN_LIST gpu_bench_variants)
    set(file ${gpu_bench_policy_${member}})
    if(member STREQUAL "unfused")
      set(form --kvc-form-kernels=unfused=1)
    endif()
  else()
    set(file ${gpu_bench_alternative_policy_${member}})
  endif()
  set(${file_var} ${file} PARENT_SCOPE)
  set(${form_var} ${form} PARENT_SCOPE)
endfunction()
