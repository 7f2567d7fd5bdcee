//===- Gguf.cpp - GGUF model file reader ----------------------------------===//
//
// Part of kvc, the KV-cache policy compiler.
//
//===----------------------------------------------------------------------===//
//
// File layout (all integers little-endian):
//   magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
//   metadata: { string key, u32 type, value }*,
//   tensor infos: { string name, u32 n_dims, u64 dims[n_dims], u32 type,
//                   u64 offset }*,
//   padding to `general.alignment` (default 32), then the tensor data.
// A string is a u64 byte length followed by the bytes (no terminator); an
// array is a u32 element type, a u64 count and the elements.
//
//===----------------------------------------------------------------------===//

#include "tools/kvc-run/Gguf.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvc {
namespace run {

namespace {

/// GGML supports at most four tensor dimensions.
constexpr uint32_t kMaxDims = 4;
/// Arrays of arrays are legal; bound the nesting so a hostile file cannot
/// exhaust the stack.
constexpr int kMaxArrayDepth = 8;
/// Bound on the elements of one tensor, far above any model, so that sizes
/// computed from dimensions cannot overflow.
constexpr uint64_t kMaxElements = uint64_t(1) << 48;

/// Reads little-endian values from the mapped file, checking every access
/// against the end of the file.
class Cursor {
public:
  Cursor(const std::string &path, const uint8_t *base, size_t size)
      : path_(path), base_(base), size_(size) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(size_t at, const std::string &what) const {
    std::ostringstream os;
    os << path_ << ": offset " << at << ": " << what;
    throw GgufError(os.str());
  }

  const uint8_t *take(size_t n, const char *what) {
    if (n > remaining()) {
      std::ostringstream os;
      os << "expected " << what << " (" << n << " bytes) but the file ends "
         << "after " << remaining() << " more bytes";
      fail(pos_, os.str());
    }
    const uint8_t *p = base_ + pos_;
    pos_ += n;
    return p;
  }

  template <typename T> T read(const char *what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }

  std::string readString(const char *what) {
    size_t at = pos_;
    uint64_t len = read<uint64_t>(what);
    if (len > remaining()) {
      std::ostringstream os;
      os << "expected " << what << " of " << len << " bytes, but only "
         << remaining() << " bytes remain";
      fail(at, os.str());
    }
    const uint8_t *p = take(len, what);
    return std::string(reinterpret_cast<const char *>(p), len);
  }

private:
  const std::string &path_;
  const uint8_t *base_;
  size_t size_;
  size_t pos_ = 0;
};

/// Smallest encoded size of one value of `type`, used to reject array
/// counts that cannot fit in the rest of the file before allocating.
size_t minEncodedSize(GgufType type) {
  switch (type) {
  case GgufType::UInt8:
  case GgufType::Int8:
  case GgufType::Bool:
    return 1;
  case GgufType::UInt16:
  case GgufType::Int16:
    return 2;
  case GgufType::UInt32:
  case GgufType::Int32:
  case GgufType::Float32:
    return 4;
  case GgufType::String:
  case GgufType::UInt64:
  case GgufType::Int64:
  case GgufType::Float64:
    return 8;
  case GgufType::Array:
    return 12;
  }
  return 1;
}

bool isValidType(uint32_t t) { return t <= uint32_t(GgufType::Float64); }

GgufValue readValue(Cursor &cur, GgufType type, const std::string &key,
                    int depth) {
  GgufValue v;
  v.type = type;
  std::string what = "value of '" + key + "'";
  switch (type) {
  case GgufType::UInt8:
    v.u = cur.read<uint8_t>(what.c_str());
    v.i = int64_t(v.u);
    break;
  case GgufType::Int8:
    v.i = cur.read<int8_t>(what.c_str());
    v.u = uint64_t(v.i);
    break;
  case GgufType::UInt16:
    v.u = cur.read<uint16_t>(what.c_str());
    v.i = int64_t(v.u);
    break;
  case GgufType::Int16:
    v.i = cur.read<int16_t>(what.c_str());
    v.u = uint64_t(v.i);
    break;
  case GgufType::UInt32:
    v.u = cur.read<uint32_t>(what.c_str());
    v.i = int64_t(v.u);
    break;
  case GgufType::Int32:
    v.i = cur.read<int32_t>(what.c_str());
    v.u = uint64_t(v.i);
    break;
  case GgufType::UInt64:
    v.u = cur.read<uint64_t>(what.c_str());
    v.i = int64_t(v.u);
    break;
  case GgufType::Int64:
    v.i = cur.read<int64_t>(what.c_str());
    v.u = uint64_t(v.i);
    break;
  case GgufType::Float32:
    v.f = cur.read<float>(what.c_str());
    break;
  case GgufType::Float64:
    v.f = cur.read<double>(what.c_str());
    break;
  case GgufType::Bool: {
    size_t at = cur.offset();
    uint8_t b = cur.read<uint8_t>(what.c_str());
    if (b > 1)
      cur.fail(at, "expected a bool (0 or 1) for '" + key + "', found " +
                       std::to_string(b));
    v.b = b != 0;
    break;
  }
  case GgufType::String:
    v.str = cur.readString(what.c_str());
    break;
  case GgufType::Array: {
    size_t at = cur.offset();
    if (depth >= kMaxArrayDepth)
      cur.fail(at, "arrays nested deeper than " +
                       std::to_string(kMaxArrayDepth) + " levels in '" + key +
                       "'");
    uint32_t elem = cur.read<uint32_t>("array element type");
    if (!isValidType(elem))
      cur.fail(at, "expected an array element type (0..12) for '" + key +
                       "', found " + std::to_string(elem));
    v.elemType = GgufType(elem);
    size_t countAt = cur.offset();
    uint64_t count = cur.read<uint64_t>("array length");
    if (count > cur.remaining() / minEncodedSize(v.elemType))
      cur.fail(countAt, "array '" + key + "' claims " + std::to_string(count) +
                            " elements, more than the rest of the file holds");
    v.elems.reserve(count);
    for (uint64_t i = 0; i < count; ++i)
      v.elems.push_back(readValue(cur, v.elemType, key, depth + 1));
    break;
  }
  }
  return v;
}

std::string typeError(const std::string &key, const GgufValue &v,
                      const char *expected) {
  return std::string("metadata '") + key + "' has type " +
         ggufTypeName(v.type) + ", expected " + expected;
}

} // namespace

const char *ggufTypeName(GgufType type) {
  switch (type) {
  case GgufType::UInt8:
    return "uint8";
  case GgufType::Int8:
    return "int8";
  case GgufType::UInt16:
    return "uint16";
  case GgufType::Int16:
    return "int16";
  case GgufType::UInt32:
    return "uint32";
  case GgufType::Int32:
    return "int32";
  case GgufType::Float32:
    return "float32";
  case GgufType::Bool:
    return "bool";
  case GgufType::String:
    return "string";
  case GgufType::Array:
    return "array";
  case GgufType::UInt64:
    return "uint64";
  case GgufType::Int64:
    return "int64";
  case GgufType::Float64:
    return "float64";
  }
  return "unknown";
}

bool GgufValue::isInteger() const {
  switch (type) {
  case GgufType::UInt8:
  case GgufType::Int8:
  case GgufType::UInt16:
  case GgufType::Int16:
  case GgufType::UInt32:
  case GgufType::Int32:
  case GgufType::UInt64:
  case GgufType::Int64:
    return true;
  default:
    return false;
  }
}

std::string GgufValue::toString() const {
  std::ostringstream os;
  switch (type) {
  case GgufType::UInt8:
  case GgufType::UInt16:
  case GgufType::UInt32:
  case GgufType::UInt64:
    os << u;
    break;
  case GgufType::Int8:
  case GgufType::Int16:
  case GgufType::Int32:
  case GgufType::Int64:
    os << i;
    break;
  case GgufType::Float32:
  case GgufType::Float64:
    os << f;
    break;
  case GgufType::Bool:
    os << (b ? "true" : "false");
    break;
  case GgufType::String:
    os << '"' << (str.size() > 60 ? str.substr(0, 60) + "..." : str) << '"';
    break;
  case GgufType::Array: {
    os << ggufTypeName(elemType) << '[' << elems.size() << "] {";
    for (size_t k = 0; k < elems.size() && k < 4; ++k)
      os << (k ? ", " : "") << elems[k].toString();
    if (elems.size() > 4)
      os << ", ...";
    os << '}';
    break;
  }
  }
  return os.str();
}

uint64_t GgufTensor::numElements() const {
  uint64_t n = 1;
  for (uint64_t d : dims)
    n *= d;
  return n;
}

uint64_t GgufTensor::numRows() const {
  return dims.empty() ? 1 : numElements() / dims[0];
}

uint64_t GgufTensor::rowBytes() const {
  const TypeLayout *l = typeLayout(uint32_t(type));
  return dims.empty() ? 0 : dims[0] / l->blockElems * l->blockBytes;
}

std::string GgufTensor::shapeString() const {
  std::ostringstream os;
  os << '[';
  for (size_t k = 0; k < dims.size(); ++k)
    os << (k ? ", " : "") << dims[k];
  os << ']';
  return os.str();
}

GgufFile::GgufFile(const std::string &path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw GgufError(path + ": cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    throw GgufError(path + ": cannot stat: " + std::strerror(err));
  }
  size_ = size_t(st.st_size);
  if (size_ == 0) {
    ::close(fd_);
    throw GgufError(path + ": offset 0: expected the GGUF magic, the file is "
                           "empty");
  }
  void *p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd_);
    throw GgufError(path + ": cannot map: " + std::strerror(err));
  }
  base_ = static_cast<const uint8_t *>(p);
  try {
    parse();
  } catch (...) {
    ::munmap(const_cast<uint8_t *>(base_), size_);
    ::close(fd_);
    throw;
  }
}

GgufFile::~GgufFile() {
  ::munmap(const_cast<uint8_t *>(base_), size_);
  ::close(fd_);
}

void GgufFile::parse() {
  Cursor cur(path_, base_, size_);
  const uint8_t *magic = cur.take(4, "the GGUF magic");
  if (std::memcmp(magic, "GGUF", 4) != 0)
    cur.fail(0, "expected the magic \"GGUF\"; this is not a GGUF file");
  version_ = cur.read<uint32_t>("the format version");
  if (version_ != 2 && version_ != 3)
    cur.fail(4, "expected format version 2 or 3, found " +
                    std::to_string(version_));
  uint64_t nTensors = cur.read<uint64_t>("the tensor count");
  uint64_t nKv = cur.read<uint64_t>("the metadata count");
  // Each metadata entry takes at least 12 bytes, each tensor info 24.
  if (nKv > cur.remaining() / 12)
    cur.fail(16, "metadata count " + std::to_string(nKv) +
                     " cannot fit in the file");
  if (nTensors > cur.remaining() / 24)
    cur.fail(8, "tensor count " + std::to_string(nTensors) +
                    " cannot fit in the file");

  for (uint64_t k = 0; k < nKv; ++k) {
    size_t at = cur.offset();
    std::string key = cur.readString("a metadata key");
    size_t typeAt = cur.offset();
    uint32_t type = cur.read<uint32_t>("a metadata value type");
    if (!isValidType(type))
      cur.fail(typeAt, "expected a metadata value type (0..12) for '" + key +
                           "', found " + std::to_string(type));
    GgufValue v = readValue(cur, GgufType(type), key, 0);
    if (!kv_.emplace(key, std::move(v)).second)
      cur.fail(at, "duplicate metadata key '" + key + "'");
  }

  if (const GgufValue *a = find("general.alignment")) {
    if (a->type != GgufType::UInt32)
      throw GgufError(path_ + ": " +
                      typeError("general.alignment", *a, "uint32"));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      throw GgufError(path_ +
                      ": general.alignment must be a power of two, "
                      "found " +
                      std::to_string(a->u));
    alignment_ = a->u;
  }

  for (uint64_t t = 0; t < nTensors; ++t) {
    GgufTensor info;
    size_t at = cur.offset();
    info.name = cur.readString("a tensor name");
    uint32_t nDims = cur.read<uint32_t>("a tensor rank");
    if (nDims == 0 || nDims > kMaxDims)
      cur.fail(at, "tensor '" + info.name + "' has " + std::to_string(nDims) +
                       " dimensions, expected 1 to " +
                       std::to_string(kMaxDims));
    uint64_t elems = 1;
    for (uint32_t d = 0; d < nDims; ++d) {
      size_t dimAt = cur.offset();
      uint64_t dim = cur.read<uint64_t>("a tensor dimension");
      if (dim == 0 || dim > kMaxElements / elems)
        cur.fail(dimAt, "tensor '" + info.name +
                            "' has an implausible "
                            "dimension " +
                            std::to_string(dim));
      elems *= dim;
      info.dims.push_back(dim);
    }
    size_t typeAt = cur.offset();
    uint32_t type = cur.read<uint32_t>("a tensor type");
    const TypeLayout *layout = typeLayout(type);
    if (!layout)
      cur.fail(typeAt, "tensor '" + info.name + "' has unknown type id " +
                           std::to_string(type));
    info.type = GgmlType(type);
    if (info.dims[0] % layout->blockElems != 0)
      cur.fail(at, "tensor '" + info.name + "' of type " + layout->name +
                       " has a row of " + std::to_string(info.dims[0]) +
                       " elements, not a multiple of the block size " +
                       std::to_string(layout->blockElems));
    info.offset = cur.read<uint64_t>("a tensor data offset");
    info.nbytes = elems / layout->blockElems * layout->blockBytes;
    if (!tensorIndex_.emplace(info.name, tensors_.size()).second)
      cur.fail(at, "duplicate tensor name '" + info.name + "'");
    tensors_.push_back(std::move(info));
  }

  uint64_t dataStart =
      (uint64_t(cur.offset()) + alignment_ - 1) / alignment_ * alignment_;
  if (dataStart > size_)
    cur.fail(cur.offset(), "expected the tensor data section at offset " +
                               std::to_string(dataStart) +
                               ", past the end of the file");
  for (GgufTensor &info : tensors_) {
    if (info.offset % alignment_ != 0)
      throw GgufError(path_ + ": tensor '" + info.name + "' data offset " +
                      std::to_string(info.offset) + " is not a multiple of " +
                      "the alignment " + std::to_string(alignment_));
    if (info.offset > size_ - dataStart ||
        info.nbytes > size_ - dataStart - info.offset)
      throw GgufError(path_ + ": offset " +
                      std::to_string(dataStart + info.offset) + ": expected " +
                      std::to_string(info.nbytes) +
                      " bytes of data for tensor '" + info.name +
                      "', but the file ends at " + std::to_string(size_));
    info.data = base_ + dataStart + info.offset;
  }
}

const GgufValue *GgufFile::find(const std::string &key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensor *GgufFile::findTensor(const std::string &name) const {
  auto it = tensorIndex_.find(name);
  return it == tensorIndex_.end() ? nullptr : &tensors_[it->second];
}

uint64_t GgufFile::requireUInt(const std::string &key) const {
  const GgufValue *v = find(key);
  if (!v)
    throw GgufError(path_ + ": missing metadata '" + key + "'");
  if (!v->isInteger() || v->i < 0)
    throw GgufError(path_ + ": " +
                    typeError(key, *v, "a non-negative integer"));
  return v->u;
}

uint64_t GgufFile::getUInt(const std::string &key, uint64_t fallback) const {
  return find(key) ? requireUInt(key) : fallback;
}

double GgufFile::requireFloat(const std::string &key) const {
  const GgufValue *v = find(key);
  if (!v)
    throw GgufError(path_ + ": missing metadata '" + key + "'");
  if (v->type == GgufType::Float32 || v->type == GgufType::Float64)
    return v->f;
  if (v->isInteger())
    return double(v->i);
  throw GgufError(path_ + ": " + typeError(key, *v, "a number"));
}

double GgufFile::getFloat(const std::string &key, double fallback) const {
  return find(key) ? requireFloat(key) : fallback;
}

std::string GgufFile::requireString(const std::string &key) const {
  const GgufValue *v = find(key);
  if (!v)
    throw GgufError(path_ + ": missing metadata '" + key + "'");
  if (v->type != GgufType::String)
    throw GgufError(path_ + ": " + typeError(key, *v, "string"));
  return v->str;
}

std::string GgufFile::getString(const std::string &key,
                                const std::string &fallback) const {
  return find(key) ? requireString(key) : fallback;
}

bool GgufFile::getBool(const std::string &key, bool fallback) const {
  const GgufValue *v = find(key);
  if (!v)
    return fallback;
  if (v->type != GgufType::Bool)
    throw GgufError(path_ + ": " + typeError(key, *v, "bool"));
  return v->b;
}

const GgufValue &GgufFile::requireArray(const std::string &key,
                                        GgufType elemType) const {
  const GgufValue *v = find(key);
  if (!v)
    throw GgufError(path_ + ": missing metadata '" + key + "'");
  if (v->type != GgufType::Array || v->elemType != elemType)
    throw GgufError(path_ + ": metadata '" + key + "' is " + v->toString() +
                    ", expected an array of " + ggufTypeName(elemType));
  return *v;
}

const GgufTensor &
GgufFile::requireTensor(const std::string &name,
                        const std::vector<uint64_t> &dims) const {
  const GgufTensor *t = findTensor(name);
  if (!t)
    throw GgufError(path_ + ": missing tensor '" + name + "'");
  if (t->dims != dims) {
    GgufTensor want;
    want.dims = dims;
    throw GgufError(path_ + ": tensor '" + name + "' has shape " +
                    t->shapeString() + ", expected " + want.shapeString());
  }
  if (!isComputeType(t->type))
    throw GgufError(path_ + ": tensor '" + name + "' has type " +
                    typeLayout(uint32_t(t->type))->name +
                    ", which kvc-run cannot compute with (supported: F32, "
                    "F16, BF16, Q4_0, Q4_1, Q8_0)");
  return *t;
}

} // namespace run
} // namespace kvc
