//===- KernelEmitterBase.h - what a kernel's two emitters share -*- C++ -*-===//
//
// The C++ emitter (CppEmitter.cpp) and the CUDA emitter (CudaEmitter.cpp)
// each turn one kernel of a policy into an entry point and its stages. The
// entry point's C signature, the score buffers the stages write, the op
// comments above each stage and the diagnostics for what a backend cannot
// generate are the same in both; they live here. What differs (loops over
// heads on the CPU, a stages kernel and launches on CUDA) stays in each
// emitter.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_CODEGEN_KERNELEMITTERBASE_H
#define KVC_CODEGEN_KERNELEMITTERBASE_H

#include "codegen/Emitter.h"

#include "mlir/IR/AsmState.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace kvc {

/// The C name of a kernel's entry point: kvc_<policy>_<target>_<kind>.
std::string entryName(PolicyOp policy, KernelOp kernel,
                      llvm::StringRef target);

/// The checks of an entry point `entry` that `layer` is one of the
/// policy's.
std::string layerCheck(const std::string &entry);

/// The checks of a prefill-time entry point `entry` (n entries, a
/// workspace): a prompt of at least one entry, and a workspace of at least
/// <entry>_workspace_bytes(n).
std::string promptChecks(const std::string &entry);

/// The check of a prefill `entry` that every kv-head of `layer` is empty,
/// through the backend's `tryMacro`; with `appends` (a prefill that gathers
/// entries into the pages) followed by its kvc::LayerAppends `appends`,
/// which empties the layer again unless the entry point calls
/// appends.keep() before it returns.
std::string emptyLayerCheck(const std::string &entry, llvm::StringRef tryMacro,
                            bool appends);

/// The check of an entry point `entry` that the context's geometry is the
/// policy's (layers, query and kv-heads, head dim), reading the context's
/// configuration through the backend's `tryMacro` (KVC_CPU_TRY,
/// KVC_CUDA_TRY).
std::string contextGeometryCheck(const std::string &entry,
                                 llvm::StringRef tryMacro);

/// The state and helpers of one kernel's emitter for backend `target`
/// ("cpu" or "cuda"; the CUDA entry points take a trailing stream).
class KernelEmitterBase {
public:
  /// The C declaration of the entry point (without a trailing ';').
  std::string declaration();
  /// Its workspace query.
  std::string workspaceDeclaration();
  /// Decode: the entry point of a batch of sequences, one step each, and
  /// its workspace query.
  std::string batchDeclaration();
  std::string batchWorkspaceDeclaration();

protected:
  KernelEmitterBase(PolicyOp policy, KernelOp kernel, mlir::AsmState &asmState,
                    llvm::StringRef target);

  /// A score buffer of the current head: `perQuery` ones hold a row per
  /// query head of the group (n floats apart on the CPU, `stride` on
  /// CUDA).
  struct Buffer {
    std::string name;
    bool perQuery;
  };

  /// A new float buffer s<N> that holds `value`; returns its name.
  std::string define(mlir::Value value, bool perQuery);
  /// Declares an alias of `value` to an existing buffer.
  void bind(mlir::Value value, const std::string &bufferName, bool perQuery);
  /// `op` as it prints, as a `//` comment.
  std::string opComment(mlir::Operation *op);
  /// The error for an op (in this kind of kernel) that the backend does
  /// not generate, with `why` when given.
  mlir::LogicalResult unsupported(mlir::Operation *op,
                                  llvm::StringRef why = "");

  PolicyOp policy;
  KernelOp kernel;
  mlir::AsmState &asmState;
  /// "cpu" or "cuda".
  std::string target;
  bool decode;
  /// The entry point's name (the CUDA emitter renames it while it emits
  /// the parts of a decode step, so that their messages name them).
  std::string name;

  llvm::DenseMap<mlir::Value, Buffer> values;
  llvm::SmallVector<Buffer> floatBuffers;
  /// The variable of each budget op.
  llvm::DenseMap<mlir::Value, std::string> budgets;
  /// The expression of every head-independent budget, so that a loop or
  /// kernel other than the one that declared it can recompute it.
  llvm::DenseMap<mlir::Value, std::string> budgetExprs;
  /// The kernel's attention pass, if any.
  AttentionPassOp attention;
  /// The op that needs every head of the layer (kvc.layer_reduce,
  /// kvc.budget_adaptive): the stages before and after it run apart.
  mlir::Operation *crossOp = nullptr;
  /// The merge that folds evicted prompt entries into kept ones, if any.
  mlir::Operation *merge = nullptr;
};

} // namespace kvc

#endif // KVC_CODEGEN_KERNELEMITTERBASE_H
