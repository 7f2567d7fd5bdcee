//===- HostStubFixture.cu - A host call of a device function -------------===//
//
// The case test/gpu/host_stubs_test.sh exists for, built and never run: a
// __device__ function called from host code inside a template. nvcc
// accepts it and compiles the call into a host body that exits 1 without a
// message; the gpu.host-stubs.detects test checks that the script names
// HostStubFixture<2>::twice in this executable.
//
//===----------------------------------------------------------------------===//

template <int N> struct HostStubFixture {
  __device__ static int twice(int x) { return N * x; }
};

template <int N> int callFromHost(int x) {
  return HostStubFixture<N>::twice(x);
}

int main(int argc, char **) { return callFromHost<2>(argc); }
