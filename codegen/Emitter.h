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

/// Records the low page class of a kernel's mixed-precision gather (if
/// any) in `storage`.
void addLowClass(llvm::ArrayRef<KernelOp> kernels, RuntimeStorage &storage);

/// Maps the storage formats of a kernel's gather/append to the runtime's
/// per-context format; emits an error on `op` when the runtime has none.
mlir::FailureOr<RuntimeStorage> mapStorage(mlir::Operation *op,
                                           FormatAttr key, FormatAttr value,
                                           mlir::IntegerAttr residual);

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

/// The batch entry point of decode kernel `kernel` named `name`
/// (`<name>_batch`), with a trailing stream argument for CUDA; and its
/// workspace query.
std::string batchDecodeDeclaration(const std::string &name, KernelOp kernel,
                                   bool stream);
std::string batchWorkspaceDeclaration(const std::string &name);
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
