//===- Gguf.h - GGUF model file reader --------------------------*- C++ -*-===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// Reads GGUF files (versions 2 and 3): the header, every metadata value
// (scalars, strings and nested arrays), the tensor table, and maps the file
// into memory so tensor data is used in place. Every read is bounds-checked;
// a malformed file raises GgufError naming the file, the byte offset and what
// was expected there.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_TOOLS_KVCRUN_GGUF_H
#define KVC_TOOLS_KVCRUN_GGUF_H

#include "tools/kvc-run/Quant.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvc {
namespace run {

/// An error in a GGUF file or in its use; the message is complete and fit to
/// print as is.
class GgufError : public std::runtime_error {
public:
  explicit GgufError(const std::string &message)
      : std::runtime_error(message) {}
};

/// The value types of GGUF metadata, numbered as in the file.
enum class GgufType : uint32_t {
  UInt8 = 0,
  Int8 = 1,
  UInt16 = 2,
  Int16 = 3,
  UInt32 = 4,
  Int32 = 5,
  Float32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  UInt64 = 10,
  Int64 = 11,
  Float64 = 12,
};

/// Returns the GGUF spelling of a metadata type ("uint32", "array", ...).
const char *ggufTypeName(GgufType type);

/// One metadata value. Integers of every width are widened into `i` (or `u`
/// for unsigned types), floats into `f`; arrays keep their element type and
/// hold their elements in `elems`.
struct GgufValue {
  GgufType type = GgufType::UInt8;
  /// Element type; meaningful for arrays only.
  GgufType elemType = GgufType::UInt8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  bool b = false;
  std::string str;
  std::vector<GgufValue> elems;

  /// True for the integer types of either signedness.
  bool isInteger() const;
  /// Renders the value for diagnostics; long arrays are abbreviated.
  std::string toString() const;
};

/// One entry of the tensor table.
struct GgufTensor {
  std::string name;
  /// Dimensions in GGUF order: dims[0] is the contiguous (row) dimension.
  std::vector<uint64_t> dims;
  GgmlType type = GgmlType::F32;
  /// Offset of the data relative to the start of the data section.
  uint64_t offset = 0;
  /// Size of the data in bytes, computed from dims and type.
  uint64_t nbytes = 0;
  /// The data, inside the mapped file.
  const uint8_t *data = nullptr;

  /// Number of elements.
  uint64_t numElements() const;
  /// Number of rows: the product of all dimensions but the first.
  uint64_t numRows() const;
  /// Bytes of one row of dims[0] elements.
  uint64_t rowBytes() const;
  /// Renders the shape as "[d0, d1, ...]".
  std::string shapeString() const;
};

/// A GGUF file mapped read-only into memory.
class GgufFile {
public:
  /// Opens, maps and parses `path`; throws GgufError on any defect.
  explicit GgufFile(const std::string &path);
  ~GgufFile();
  GgufFile(const GgufFile &) = delete;
  GgufFile &operator=(const GgufFile &) = delete;

  const std::string &path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue> &metadata() const { return kv_; }
  const std::vector<GgufTensor> &tensors() const { return tensors_; }

  /// Returns the metadata value `key`, or null when absent.
  const GgufValue *find(const std::string &key) const;
  /// Returns the tensor `name`, or null when absent.
  const GgufTensor *findTensor(const std::string &name) const;

  /// Typed metadata accessors. The `require*` forms throw GgufError naming
  /// the key when it is absent or of the wrong type; the `get*` forms return
  /// `fallback` when it is absent (and still throw on a wrong type).
  uint64_t requireUInt(const std::string &key) const;
  uint64_t getUInt(const std::string &key, uint64_t fallback) const;
  double requireFloat(const std::string &key) const;
  double getFloat(const std::string &key, double fallback) const;
  std::string requireString(const std::string &key) const;
  std::string getString(const std::string &key,
                        const std::string &fallback) const;
  bool getBool(const std::string &key, bool fallback) const;
  /// Returns an array whose elements have type `elemType`.
  const GgufValue &requireArray(const std::string &key,
                                GgufType elemType) const;

  /// Returns the tensor `name`, checking its type is one kvc-run can
  /// compute with and its shape is `dims`; throws GgufError otherwise.
  const GgufTensor &requireTensor(const std::string &name,
                                  const std::vector<uint64_t> &dims) const;

private:
  void parse();

  std::string path_;
  int fd_ = -1;
  const uint8_t *base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensorIndex_;
};

} // namespace run
} // namespace kvc

#endif // KVC_TOOLS_KVCRUN_GGUF_H
