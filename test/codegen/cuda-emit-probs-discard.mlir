// The probabilities of kvc.attn_last leave L2 unwritten after their last
// reader (codegen/CudaEmitter.cpp): for a policy without a cross-head op
// that ranks each head by its group's mean last-query weight, the last
// reader is the stages the last of a head's fold blocks runs, which drop
// the head's rows after the selection; the fold blocks drop only their
// logits. (TOVA, whose cross-head op is the last reader: cuda-emit.mlir.)
// The library compiles with nvcc, and its PTX discards in the fold kernel
// after the arrival that picks the last block, as well as before it.
//
// RUN: rm -rf %t && mkdir -p %t
// RUN: kvc-opt %s "--kvc-specialize=layers=1 q-heads=8 kv-heads=2 head-dim=64 dtype=f16" --kvc-form-kernels --kvc-emit="target=cuda output-dir=%t" -o /dev/null
// RUN: FileCheck %s --input-file=%t/kvc_last_per_head_cuda.cu
// RUN: %if nvcc %{ %nvcc -std=c++17 -I%kvc_src_root -I%t -gencode arch=compute_90a,code=sm_90a -ptx %t/kvc_last_per_head_cuda.cu -o %t/sm90.ptx %}
// RUN: %if nvcc %{ FileCheck %s --check-prefix=PTX < %t/sm90.ptx %}

kvc.policy @last_per_head {
  kvc.phase over_budget {
    %last = kvc.attn_last
    %head = kvc.group_reduce mean %last
    %budget = kvc.budget_uniform count 1024
    %keep = kvc.topk %head, %budget tie recent : !kvc.score<kv_head>
    kvc.evict %keep
  }
}

// CHECK-LABEL: __device__ void decodeStages(
// CHECK: float *probs = w.probs + h * kGroup * stride;
// CHECK: kvc::cuda::groupReduce<kStageThreads>(probs, kGroup, stride, n, kvc::cuda::Reduce::Mean, s0);
// CHECK: kvc::cuda::publishVictims<kStageThreads>(t);
// CHECK-NEXT: // Nothing reads the head's probabilities again this step: their lines
// CHECK-NEXT: // leave L2 without a write to device memory.
// CHECK-NEXT: kvc::cuda::discardRowLines<kStageThreads>(probs, kGroup, stride, {0, n});
// CHECK-NEXT: }
// CHECK-LABEL: struct DecodeFoldRanges {
// CHECK: kvc::cuda::writeProbabilities<kGroup, kThreads>(
// CHECK: kvc::cuda::discardRowLines<kThreads>(
// CHECK-NEXT: w.logits + h * kGroup * stride, kGroup, stride, r);
// CHECK-NOT: probs
// CHECK: if (kvc::cuda::lastArrival(t.arrivals, arrivals + foldBlocks))
// CHECK-NEXT: decodeStages<kThreads>(

// PTX-LABEL: .entry {{.*}}decodeFoldENS_16DecodeFoldRanges
// PTX: discard.global.L2 [{{%rd[0-9]+}}], 128;
// PTX: atom.add.u32
// PTX: discard.global.L2 [{{%rd[0-9]+}}], 128;
