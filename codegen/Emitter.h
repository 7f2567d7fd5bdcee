//===- Emitter.h - source emitters of kvc kernels ---------------*- C++ -*-===//
//
// Emitters turn the kernels of a policy (after kvc-form-kernels) into
// sources. The C++ emitter produces the CPU backend; the CUDA emitter the
// GPU backend. Both fold every constant and produce deterministic text.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_CODEGEN_EMITTER_H
#define KVC_CODEGEN_EMITTER_H

#include "dialect/KvcOps.h"

#include "llvm/Support/raw_ostream.h"

#include <string>

namespace kvc {

/// One generated file.
struct EmittedFile {
  std::string name;
  std::string contents;
};

/// How the runtime context must be configured for a policy: the format the
/// policy's storage maps to, and its KIVI parameters.
struct RuntimeStorage {
  /// Spelling of the kvc_format_t enumerator.
  std::string format = "KVC_FORMAT_FULL";
  int64_t groupSize = 0;
  int64_t residual = 0;
  /// Mixed precision: the kvc_format_t of the low page class (and
  /// groupSize its channel group).
  std::string lowFormat = "KVC_FORMAT_FULL";
};

/// The runtime storage of a policy's kernels: the format of every gather
/// and append (keys and values in one format kind; KIVI's per-channel keys
/// and per-token values; int8 and fp8 per token) and the low page class of
/// a mixed-precision gather. Emits an error on the first op whose formats
/// the runtime has no format for. `checkGather` runs on each gather once its
/// formats map (a backend's own limits); `writer`, when given, receives the
/// last op that writes entries.
mlir::FailureOr<RuntimeStorage> policyStorage(
    llvm::ArrayRef<KernelOp> kernels,
    llvm::function_ref<mlir::LogicalResult(GatherOp, KernelOp,
                                           const RuntimeStorage &)>
        checkGather = nullptr,
    mlir::Operation **writer = nullptr);

/// A float constant that reads back as the same float; infinities name the
/// building blocks' constants of namespace kvc::<ns>.
std::string floatLiteral(llvm::StringRef ns, double x);

/// A double constant that reads back as the same double.
std::string doubleLiteral(double x);

/// Spelling of a reduction and a normalization in the building blocks of
/// namespace kvc::<ns> (cpu or cuda).
std::string reduceEnumerator(llvm::StringRef ns, ReduceKind kind);
std::string normalizeEnumerator(llvm::StringRef ns, NormalizeKind kind);

/// True when `word` occurs in the C++ `text` as a whole identifier
/// outside a `//` comment (a comment that names a variable does not use
/// it).
bool usesWord(llvm::StringRef text, llvm::StringRef word);

/// True for query-head scores (one row per query head of a group).
bool isQueryScore(mlir::Value v);

/// Kernels that run at decode, and kernels that write attention outputs.
bool isDecodeKernel(KernelOp kernel);
bool writesOutput(KernelOp kernel);

/// The checks of a batch entry point `entry` on `batch` and `sequences`:
/// not empty, no sequence listed twice (kvc_check_batch, in the runtime).
std::string batchSequenceChecks(const std::string &entry);

/// Spelling of an element type in kvc_dtype_t.
std::string dtypeEnumerator(mlir::Type type);

/// The C++ constants of the statistics parameters every kernel of a policy
/// folds (kPeriod, kWindow, kHistory and kThreshold, kDecay), with their
/// comments; float literals name namespace kvc::<ns>.
std::string policyConstants(llvm::ArrayRef<KernelOp> kernels,
                            llvm::StringRef ns);

/// The kernels of `policy`; an error on it when it has no geometry or no
/// kernels (kvc-specialize and kvc-form-kernels have not run).
mlir::FailureOr<llvm::SmallVector<KernelOp>> formedKernels(PolicyOp policy);

/// The generated files' common text for backend `target` (cpu or cuda):
/// the header's opening (what generated it, the geometry, the include
/// guard, kvc_runtime.h, extern "C") and closing; the source's first lines
/// (what generated it, the geometry, the kernels, up to the period after
/// the last kernel's kind); and the geometry's constants (kLayers,
/// kQHeads, kKvHeads, kGroup, kHeadDim).
std::string headerOpening(PolicyOp policy, llvm::StringRef target);
std::string headerClosing(PolicyOp policy, llvm::StringRef target);
std::string sourceOpening(PolicyOp policy, llvm::ArrayRef<KernelOp> kernels,
                          llvm::StringRef target);
std::string geometryConstants(GeometryAttr geometry);

/// Emits the `select` kernel of a global budget for `target` (cpu or cuda):
/// host code over the score state every layer's prefill stored, ranking all
/// live entries with kvc_select_candidates and evicting the rest. Appends
/// the definition to `src` and the declarations to `hdr`.
mlir::LogicalResult emitSelectKernel(PolicyOp policy, KernelOp kernel,
                                     mlir::AsmState &asmState,
                                     llvm::StringRef target,
                                     llvm::raw_ostream &src,
                                     llvm::raw_ostream &hdr);

/// Emits the CPU backend of `policy`: a header and a C++ source.
mlir::LogicalResult emitCpp(PolicyOp policy,
                            llvm::SmallVectorImpl<EmittedFile> &files);

/// Emits the CUDA backend of `policy`: a C header and a .cu source whose
/// host entry points take a cudaStream_t (as void *) and device pointers;
/// see docs/codegen-cuda.md. Rejects head dimensions other than 32, 64 and
/// 128.
mlir::LogicalResult emitCuda(PolicyOp policy,
                             llvm::SmallVectorImpl<EmittedFile> &files);

} // namespace kvc

#endif // KVC_CODEGEN_EMITTER_H
